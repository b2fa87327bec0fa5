/* connector.c - the mini engine's side of libkvstrata (connector.h): loading the library, opening
 * and closing the handle, and the calls around a step. */
#include "connector.h"

#include "engine.h"

#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "abi/kvstrata_plans.h"

/* Print the failed hook with the library's sentence; returns -1 for the caller to pass up. */
int connector_hook_failed(const connector *c, const char *hook, kvs_status st) {
    mini_err("%s failed: %s: %s\n", hook, c->api->strerror(st), c->api->last_error(c->h));
    return -1;
}

static void *load_library(const char *explicit_path) {
    if (explicit_path) {
        void *dl = dlopen(explicit_path, RTLD_NOW | RTLD_LOCAL);
        if (!dl) mini_err("cannot load %s: %s\n", explicit_path, dlerror());
        return dl;
    }
    char exe[PATH_MAX], first_error[1024] = "";
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = '\0';
        char *slash = strrchr(exe, '/');
        if (slash) {
            *slash = '\0';
            char path[PATH_MAX + 32];
            snprintf(path, sizeof path, "%s/../lib/libkvstrata.so.1", exe);
            void *dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
            if (dl) return dl;
            snprintf(first_error, sizeof first_error, "%s", dlerror());
        }
    }
    void *dl = dlopen("libkvstrata.so", RTLD_NOW | RTLD_LOCAL);
    if (!dl)
        mini_err("cannot load libkvstrata: %s; %s (build it, or pass --lib PATH)\n", first_error,
                 dlerror());
    return dl;
}

int connector_open(connector *c, const char *lib_path, const char *config_path, kvs_dtype dtype,
                   const model *m, const kvcache *kv, int caps, const kvs_stage_desc *stages) {
    memset(c, 0, sizeof *c);
    const char *config = strcmp(config_path, "none") == 0 ? NULL : config_path;
    if (config && access(config, R_OK) != 0) {
        mini_err(
            "config file '%s' not found (%s): run from the repository root, pass --config PATH, "
            "or --config none for the library's built-in defaults\n",
            config, strerror(errno));
        return -1;
    }
    if (!(c->dl = load_library(lib_path))) return -1;
    const kvs_api *(*get_api)(uint32_t);
    *(void **)&get_api = dlsym(c->dl, "kvs_get_api");
    if (!get_api) {
        mini_err("the library exports no kvs_get_api: %s\n", dlerror());
        return -1;
    }
    c->api = get_api(KVS_ABI_MAJOR);
    if (!c->api) {
        mini_err("the library does not implement ABI major %d\n", KVS_ABI_MAJOR);
        return -1;
    }
    if (c->api->struct_size < sizeof(kvs_api)) {
        mini_err("the library's API table has %u bytes, this engine needs %zu (older library)\n",
                 c->api->struct_size, sizeof(kvs_api));
        return -1;
    }
    const model_config *mc = model_config_of(m);
    /* Everything that changes the KV goes into the model id, so different weights never share keys. */
    char attention[32];
    if (mc->is_mla)
        snprintf(attention, sizeof attention, "mla%d", mc->latent);
    else
        snprintf(attention, sizeof attention, "kv%d", mc->n_kv_heads);
    uint32_t n_layers = kvcache_params_of(kv)->n_layers;
    /* trained weights are named by their file's checksum, seeded ones by the seed */
    char weights[40];
    if (mc->weights_id)
        snprintf(weights, sizeof weights, "w%016llx", (unsigned long long)mc->weights_id);
    else
        snprintf(weights, sizeof weights, "seed%llu", (unsigned long long)mc->seed);
    snprintf(c->model_id, sizeof c->model_id, "kvs-mini-engine/d%d-l%d-h%d-%s-f%d-v%d-%s-s%d",
             mc->dim, mc->n_layers, mc->n_heads, attention, mc->ffn, mc->vocab, weights,
             stages ? (int)stages->n_stages : 1);
    kvs_model_desc desc = {
        .struct_size = sizeof desc,
        .model_id = c->model_id,
        .dtype = dtype,
        .n_layers = n_layers,
        .n_kv_heads = model_cache_heads(m),
        .head_dim = model_cache_width(m),
        .block_tokens = KV_BLOCK_TOKENS,
        .is_mla = (uint32_t)mc->is_mla,
        .tp_rank = 0,
        .tp_size = 1,
        .salt = NULL,
        .vocab_size = (uint32_t)mc->vocab,
    };
    kvs_open_params params = {
        .struct_size = sizeof params, .role = KVS_ROLE_BOTH, .config_path = config, .model = &desc};
    char err[512];
    kvs_status st = c->api->open(&params, &c->h, err, sizeof err);
    if (st != KVS_OK) {
        mini_err("open failed: %s: %s\n", c->api->strerror(st), err);
        return -1;
    }
    HOOK(c, c->api->register_kv(c->h, kvcache_views(kv), n_layers), "register_kv");
    if (stages) HOOK(c, c->api->set_stages(c->h, stages), "set_stages");
    if (caps) HOOK(c, c->api->set_plan_caps(c->h, (uint32_t)caps), "set_plan_caps");
    c->meta_cap = 4096;
    c->meta = malloc(c->meta_cap);
    c->errors_cap = kvcache_params_of(kv)->n_blocks;
    c->errors = malloc(c->errors_cap * sizeof *c->errors);
    if (!c->meta || !c->errors) {
        mini_err("out of memory\n");
        return -1;
    }
    return 0;
}

void connector_close(connector *c) {
    if (c->api && c->h) c->api->close(c->h);
    if (c->dl) dlclose(c->dl);
    free(c->meta);
    free(c->errors);
    memset(c, 0, sizeof *c);
}

/* Drain the stored/removed events (vLLM forwards them to routers; here they are only counted). */
int connector_take_events(connector *c) {
    kvs_event ev[64];
    uint64_t n;
    do {
        HOOK(c, c->api->take_events(c->h, ev, 64, &n), "take_events");
        for (uint64_t i = 0; i < n; i++) {
            if (ev[i].kind == KVS_EVENT_STORED)
                c->events_stored++;
            else if (ev[i].kind == KVS_EVENT_REMOVED)
                c->events_removed++;
        }
    } while (n == 64);
    return 0;
}

/* 1 if req_id is in the NUL-separated list of n ids. */
static int id_listed(const char *list, uint64_t n, const char *req_id) {
    for (uint64_t i = 0; i < n; i++) {
        if (strcmp(list, req_id) == 0) return 1;
        list += strlen(list) + 1;
    }
    return 0;
}

/* get_finished: whether req_id finished sending (async save) or receiving (async load). */
int connector_poll_finished(connector *c, const char *req_id, int *sending, int *receiving) {
    char sent[4096], recv[4096];
    uint64_t n_sent = 0, n_recv = 0;
    HOOK(c, c->api->get_finished(c->h, sent, sizeof sent, &n_sent, recv, sizeof recv, &n_recv),
         "get_finished");
    *sending = id_listed(sent, n_sent, req_id);
    *receiving = id_listed(recv, n_recv, req_id);
    return 0;
}

int connector_finished(connector *c, int (*on_id)(void *ctx, const char *id, int receiving),
                       void *ctx) {
    /* ids are at most 255 bytes and NUL-terminated: room for every request a batch holds */
    char lists[2][64 * 256];
    uint64_t n[2] = {0, 0};
    HOOK(c,
         c->api->get_finished(c->h, lists[0], sizeof lists[0], &n[0], lists[1], sizeof lists[1],
                              &n[1]),
         "get_finished");
    for (int k = 0; k < 2; k++) {
        const char *id = lists[k];
        for (uint64_t i = 0; i < n[k]; i++, id += strlen(id) + 1)
            if (on_id(ctx, id, k) != 0) return -1;
    }
    return 0;
}

int connector_step_meta(connector *c, const kvs_step_request *reqs, uint64_t n) {
    uint64_t len = 0;
    kvs_status st = c->api->build_meta(c->h, reqs, n, c->meta, c->meta_cap, &len);
    if (st == KVS_EOVERFLOW) {
        uint8_t *grown = realloc(c->meta, len);
        if (!grown) {
            mini_err("out of memory for %llu bytes of step metadata\n", (unsigned long long)len);
            return -1;
        }
        c->meta = grown;
        c->meta_cap = len;
        st = c->api->build_meta(c->h, reqs, n, c->meta, c->meta_cap, &len);
    }
    if (st != KVS_OK) return connector_hook_failed(c, "build_meta", st);
    HOOK(c, c->api->bind_meta(c->h, c->meta, len), "bind_meta");
    return 0;
}

int connector_stats(connector *c, kvs_stats *out) {
    memset(out, 0, sizeof *out);
    out->struct_size = sizeof *out;
    HOOK(c, c->api->stats(c->h, out), "stats");
    return 0;
}
