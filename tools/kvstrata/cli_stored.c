#include "cli_stored.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "abi/kvstrata_server.h"
#include "backends/dram/dram.h"
#include "backends/ssd/ssd_inspect.h"
#include "cli_util.h"

static void append(char *note, size_t len, const char *text) {
    size_t used = strlen(note);
    if (used + 3 >= len) return;
    snprintf(note + used, len - used, "%s%s", used ? "; " : "", text);
}

/* Objects of ssd tier tc in its (rank 0) paths; 0 when it has no data file yet. */
static uint64_t ssd_objects(const kvs_server_tier *tc) {
    char *paths[KVS_SERVER_MAX_OPTIONS];
    uint32_t n = 0;
    uint64_t objects = 0;
    kvs_ssd_inspect_options opt = {.mode = KVS_SSD_INSPECT_QUICK, .tier = tc->name};
    kvs_ssd_inspect_report *rep = cli_tier_paths(tc, 0, paths, KVS_SERVER_MAX_OPTIONS, &n) == 0
                                      ? calloc(1, sizeof *rep)
                                      : NULL;
    char err[256];
    if (rep &&
        kvs_ssd_inspect_run((const char *const *)paths, n, &opt, rep, err, sizeof err) == KVS_OK)
        objects = rep->objects;
    free(rep);
    cli_free_paths(paths, n);
    return objects;
}

int cli_stored_objects(const char *config_path, uint64_t *objects, char *note, size_t note_len) {
    *objects = 0;
    note[0] = '\0';
    kvs_server_config *config = NULL;
    if (kvs_server_config_load(config_path, &config, note, note_len) != KVS_OK) return -1;
    const kvs_server_settings *cfg = kvs_server_config_settings(config);
    for (uint32_t i = 0; i < cfg->n_tiers; i++) {
        const kvs_server_tier *tc = &cfg->tiers[i];
        uint64_t n = 0;
        if (!strcmp(tc->type, "ssd")) {
            n = ssd_objects(tc);
        } else if (!strcmp(tc->type, "dram") && tc->shm_name) {
            kvs_dram_peek_info info;
            char err[256];
            if (kvs_dram_peek(tc->shm_name, &info, err, sizeof err) == KVS_OK) n = info.objects;
        } else if (!strcmp(tc->type, "redis") || !strcmp(tc->type, "remote")) {
            char text[160];
            snprintf(text, sizeof text, "%s: its servers' objects not counted", tc->name);
            append(note, note_len, text);
            continue;
        }
        if (n) {
            char text[160];
            snprintf(text, sizeof text, "%s: %llu objects", tc->name, (unsigned long long)n);
            append(note, note_len, text);
        }
        *objects += n;
    }
    kvs_server_config_free(config);
    return 0;
}
