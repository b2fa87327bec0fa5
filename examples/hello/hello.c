/* hello.c - kvs-hello: the smallest complete program that uses libkvstrata the way an engine does.
 * It loads the library, checks its ABI version, opens a handle, saves the KV of one request's prompt
 * and restores it into another request's pages, checks the bytes, and closes. Every step is
 * checked: on a failure it prints the library's sentence and exits 1. Built in the tree as
 * build/bin/kvs-hello; built against an installed library as the README shows. */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <kvstrata/kvstrata.h>

#define PROG "kvs-hello"

/* A tiny model: 2 layers, 2 KV heads of 8 fp16 elements, pages of 16 tokens. */
enum { LAYERS = 2, HEADS = 2, HEAD_DIM = 8, ELEM = 2, BLOCK_TOKENS = 16 };
enum { PROMPT = 600, BLOCKS_PER_REQUEST = (PROMPT + BLOCK_TOKENS - 1) / BLOCK_TOKENS };
enum { BLOCKS = 2 * BLOCKS_PER_REQUEST }; /* request 1 in blocks 0.., request 2 after them */
enum { TOKEN_BYTES = HEADS * HEAD_DIM * ELEM, BLOCK_BYTES = BLOCK_TOKENS * TOKEN_BYTES };

/* The engine's paged KV cache: per layer one K and one V array of [blocks][tokens][heads][dim]. */
static uint8_t k_pages[LAYERS][BLOCKS * BLOCK_BYTES], v_pages[LAYERS][BLOCKS * BLOCK_BYTES];

static uint8_t *token_kv(uint8_t *pages, const uint32_t *table, uint64_t t) {
    return pages + (uint64_t)table[t / BLOCK_TOKENS] * BLOCK_BYTES + t % BLOCK_TOKENS * TOKEN_BYTES;
}

/* What a forward pass would write for token t of layer l (here a function of both, so a restored
 * byte can be checked). */
static void compute_layer(int l, const uint32_t *table, uint64_t from, uint64_t to) {
    for (uint64_t t = from; t < to; t++)
        for (int i = 0; i < TOKEN_BYTES; i++) {
            token_kv(k_pages[l], table, t)[i] = (uint8_t)(t * 31 + (uint64_t)i + (uint64_t)l * 7);
            token_kv(v_pages[l], table, t)[i] =
                (uint8_t)(t * 17 + (uint64_t)i + (uint64_t)l * 5 + 1);
        }
}

static const kvs_api *api;
static kvs_handle *handle;

/* Report a failed call with the library's sentence; returns 1, the exit status. */
static int failed(const char *call, kvs_status st) {
    fprintf(stderr, PROG ": %s failed: %s: %s\n", call, api->strerror(st), api->last_error(handle));
    return 1;
}
#define CHECK(call, name)                              \
    do {                                               \
        kvs_status st_ = (call);                       \
        if (st_ != KVS_OK) return failed((name), st_); \
    } while (0)

/* One engine step for request req_id: computes tokens [n_computed, n_computed + n_scheduled) after
 * landing what the connector loads, and saves every layer. */
static int step(const char *req_id, const int32_t *tokens, const uint32_t *table,
                uint64_t n_computed, uint64_t n_scheduled) {
    kvs_step_request r = {.req_id = req_id,
                          .tokens = tokens,
                          .n_tokens = PROMPT,
                          .block_ids = table,
                          .n_block_ids = BLOCKS_PER_REQUEST,
                          .n_computed = n_computed,
                          .n_scheduled = n_scheduled};
    static uint8_t meta[1 << 16];
    uint64_t len = 0;
    CHECK(api->build_meta(handle, &r, 1, meta, sizeof meta, &len), "build_meta");
    CHECK(api->bind_meta(handle, meta, len), "bind_meta");
    CHECK(api->start_load(handle), "start_load");
    for (uint32_t l = 0; l < LAYERS; l++) {
        CHECK(api->wait_layer_load(handle, l), "wait_layer_load");
        compute_layer((int)l, table, n_computed, n_computed + n_scheduled);
        CHECK(api->save_layer(handle, l), "save_layer");
    }
    CHECK(api->wait_save(handle), "wait_save");
    uint32_t bad[BLOCKS_PER_REQUEST];
    uint64_t n_bad = 0;
    CHECK(api->load_error_blocks(handle, bad, BLOCKS_PER_REQUEST, &n_bad), "load_error_blocks");
    if (n_bad) {
        fprintf(stderr, PROG ": %llu blocks of '%s' failed to load (block %u first)\n",
                (unsigned long long)n_bad, req_id, bad[0]);
        return 1;
    }
    int keep = 0;
    CHECK(api->request_finished(handle, req_id, &keep), "request_finished");
    return 0;
}

/* Save request 1's prompt, restore it into request 2's pages, compare. */
static int round_trip(void) {
    int32_t tokens[PROMPT];
    for (int t = 0; t < PROMPT; t++) tokens[t] = (int32_t)((t * 7919 + 13) % 32000);
    uint32_t table1[BLOCKS_PER_REQUEST], table2[BLOCKS_PER_REQUEST];
    for (uint32_t b = 0; b < BLOCKS_PER_REQUEST; b++) {
        table1[b] = b;
        table2[b] = BLOCKS_PER_REQUEST + b;
    }

    /* Request 1: nothing stored yet, so the whole prompt is computed, and its full chunks saved. */
    kvs_lookup_result res = {.struct_size = sizeof res};
    CHECK(api->lookup(handle, "hello-1", tokens, PROMPT, 0, &res), "lookup");
    if (res.n_hit_tokens != 0) {
        fprintf(stderr, PROG ": lookup of a new prompt found %llu tokens stored\n",
                (unsigned long long)res.n_hit_tokens);
        return 1;
    }
    CHECK(api->on_alloc(handle, "hello-1", table1, BLOCKS_PER_REQUEST, 0), "on_alloc");
    if (step("hello-1", tokens, table1, 0, PROMPT) != 0) return 1;
    kvs_stats stats = {.struct_size = sizeof stats};
    CHECK(api->stats(handle, &stats), "stats");
    printf(PROG ": request 'hello-1': computed %d tokens, saved %llu chunks (%llu bytes)\n", PROMPT,
           (unsigned long long)stats.chunks_saved, (unsigned long long)stats.bytes_saved);

    /* Request 2, the same prompt in other pages: the stored chunks are loaded, the rest computed. */
    res = (kvs_lookup_result){.struct_size = sizeof res};
    CHECK(api->lookup(handle, "hello-2", tokens, PROMPT, 0, &res), "lookup");
    if (res.n_hit_tokens == 0 || res.load_async) {
        fprintf(stderr, PROG ": lookup of the saved prompt found %llu tokens%s\n",
                (unsigned long long)res.n_hit_tokens,
                res.load_async ? " to load asynchronously, which this example does not do" : "");
        return 1;
    }
    const uint64_t hit = res.n_hit_tokens;
    CHECK(api->on_alloc(handle, "hello-2", table2, BLOCKS_PER_REQUEST, hit), "on_alloc");
    if (step("hello-2", tokens, table2, hit, PROMPT - hit) != 0) return 1;
    for (int l = 0; l < LAYERS; l++)
        for (uint64_t t = 0; t < hit; t++)
            if (memcmp(token_kv(k_pages[l], table1, t), token_kv(k_pages[l], table2, t),
                       TOKEN_BYTES) != 0 ||
                memcmp(token_kv(v_pages[l], table1, t), token_kv(v_pages[l], table2, t),
                       TOKEN_BYTES) != 0) {
                fprintf(stderr,
                        PROG ": restored KV differs from the saved KV: layer %d token %llu\n", l,
                        (unsigned long long)t);
                return 1;
            }
    CHECK(api->stats(handle, &stats), "stats");
    printf(PROG ": request 'hello-2': restored %llu of %d tokens (%llu chunks) into other pages, "
                "bit for bit; computed the other %llu\n",
           (unsigned long long)hit, PROMPT, (unsigned long long)stats.chunks_loaded,
           (unsigned long long)(PROMPT - hit));
    return 0;
}

static void usage(FILE *f) {
    fprintf(f,
            "usage: " PROG " [--lib PATH] [--config PATH]\n"
            "  --lib PATH     the library to load (default libkvstrata.so.1 from the loader's\n"
            "                 search path: LD_LIBRARY_PATH, then the system's)\n"
            "  --config PATH  the YAML configuration (default: the library's built-in one, a\n"
            "                 DRAM tier of 1 GiB)\n"
            "Saves one prompt's KV through libkvstrata, restores it into other pages and checks\n"
            "the bytes. Exits 0 when everything worked, 1 (with the reason) otherwise.\n");
}

int main(int argc, char **argv) {
    const char *lib_path = "libkvstrata.so.1", *config_path = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage(stdout);
            return 0;
        } else if (strcmp(argv[i], "--lib") == 0 && i + 1 < argc) {
            lib_path = argv[++i];
        } else if (strcmp(argv[i], "--config") == 0 && i + 1 < argc) {
            config_path = argv[++i];
        } else {
            usage(stderr);
            return 2;
        }
    }

    /* 1. Load the library and take its table for the ABI major this program was built against. */
    void *lib = dlopen(lib_path, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, PROG ": cannot load %s: %s\n", lib_path, dlerror());
        return 1;
    }
    const kvs_api *(*get_api)(uint32_t);
    *(void **)&get_api = dlsym(lib, "kvs_get_api");
    if (!get_api) {
        fprintf(stderr, PROG ": %s is not libkvstrata (no kvs_get_api): %s\n", lib_path, dlerror());
        dlclose(lib);
        return 1;
    }
    api = get_api(KVS_ABI_MAJOR);
    if (!api) {
        fprintf(stderr, PROG ": %s does not implement ABI major %d\n", lib_path, KVS_ABI_MAJOR);
        dlclose(lib);
        return 1;
    }
    /* This program calls only the hooks of ABI 1.0, which end where 1.1 appended set_stream. */
    if (api->struct_size < offsetof(kvs_api, set_stream)) {
        fprintf(stderr, PROG ": %s has a %u-byte table, shorter than ABI 1.0's\n", lib_path,
                api->struct_size);
        dlclose(lib);
        return 1;
    }
    printf(PROG ": loaded %s: ABI %u.%u (this program was built against %d.%d)\n", lib_path,
           api->abi_major, api->abi_minor, KVS_ABI_MAJOR, KVS_ABI_MINOR);

    /* 2. Open a handle that plays both roles (scheduler and worker) for a tiny model. */
    kvs_model_desc model = {.struct_size = sizeof model,
                            .model_id = "kvs-hello/tiny",
                            .dtype = KVS_DTYPE_FP16,
                            .n_layers = LAYERS,
                            .n_kv_heads = HEADS,
                            .head_dim = HEAD_DIM,
                            .block_tokens = BLOCK_TOKENS,
                            .tp_size = 1,
                            .vocab_size = 32000};
    kvs_open_params params = {.struct_size = sizeof params,
                              .role = KVS_ROLE_BOTH,
                              .config_path = config_path,
                              .model = &model};
    char err[512];
    kvs_status st = api->open(&params, &handle, err, sizeof err);
    if (st != KVS_OK) {
        fprintf(stderr, PROG ": open failed: %s: %s\n", api->strerror(st), err);
        dlclose(lib);
        return 1;
    }
    kvs_stats stats = {.struct_size = sizeof stats};
    int rc = 0;
    if ((st = api->stats(handle, &stats)) != KVS_OK)
        rc = failed("stats", st);
    else
        printf(PROG ": opened a handle with %s: %u tier%s\n",
               config_path ? config_path : "the built-in configuration", stats.n_tiers,
               stats.n_tiers == 1 ? "" : "s");

    /* 3. Describe the engine's pages (host memory here), then save and restore through them. */
    kvs_layer_view views[LAYERS];
    for (int l = 0; l < LAYERS; l++)
        views[l] = (kvs_layer_view){.struct_size = sizeof views[l],
                                    .device_kind = KVS_DEVICE_HOST,
                                    .n_blocks = BLOCKS,
                                    .k_base = k_pages[l],
                                    .v_base = v_pages[l],
                                    .block_stride = BLOCK_BYTES,
                                    .token_stride = TOKEN_BYTES,
                                    .head_stride = HEAD_DIM * ELEM};
    if (rc == 0 && (st = api->register_kv(handle, views, LAYERS)) != KVS_OK)
        rc = failed("register_kv", st);
    if (rc == 0) rc = round_trip();

    /* 4. Close the handle and unload the library. */
    api->close(handle);
    dlclose(lib);
    printf(PROG ": %s\n", rc == 0 ? "closed; everything worked" : "closed after a failure");
    return rc;
}
