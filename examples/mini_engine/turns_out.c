/* turns_out.c - --turns-out (turns_out.h). */
#include "turns_out.h"

#include <errno.h>
#include <string.h>

#include "engine.h"

FILE *turns_out_open(const char *path) {
    FILE *f = fopen(path, "w");
    if (!f) mini_err("--turns-out %s: %s\n", path, strerror(errno));
    return f;
}

/* s as a JSON string: trace sessions are any text the trace's author chose. */
static void json_string(FILE *f, const char *s) {
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\')
            fprintf(f, "\\%c", *p);
        else if (*p < 0x20)
            fprintf(f, "\\u%04x", *p);
        else
            fputc(*p, f);
    }
    fputc('"', f);
}

int turns_out_write(FILE *f, mode_run *run, const workload *w, int i, kvs_stats *prev) {
    const turn_result *r = &run->turns[i];
    fprintf(f, "{\"mode\":\"%s\",\"session\":", run->use_connector ? "connector" : "no_connector");
    json_string(f, w->session_names[r->session]);
    fprintf(f,
            ",\"turn\":%d,\"prompt\":%llu,\"local_hit_tokens\":%llu,\"connector_hit_tokens\":%llu,"
            "\"error_blocks\":%llu,\"ttft_ms\":%.3f",
            r->turn, (unsigned long long)r->prompt, (unsigned long long)r->local_hit,
            (unsigned long long)r->ext_hit, (unsigned long long)r->error_blocks, r->ttft_ms);
    if (run->e.conn) {
        kvs_stats st;
        if (connector_stats(&run->conn, &st) != 0) return -1;
        uint32_t n = st.n_tiers < KVS_STATS_MAX_TIERS ? st.n_tiers : KVS_STATS_MAX_TIERS;
        fprintf(f, ",\"tier_chunks_loaded\":[");
        for (uint32_t t = 0; t < n; t++)
            fprintf(f, "%s%llu", t ? "," : "",
                    (unsigned long long)(st.tier_chunks_loaded[t] - prev->tier_chunks_loaded[t]));
        fprintf(f, "],\"tier_bytes_loaded\":[");
        for (uint32_t t = 0; t < n; t++)
            fprintf(f, "%s%llu", t ? "," : "",
                    (unsigned long long)(st.tier_bytes_loaded[t] - prev->tier_bytes_loaded[t]));
        fprintf(f, "]");
        *prev = st;
    }
    fprintf(f, "}\n");
    if (fflush(f) != 0 || ferror(f)) {
        mini_err("--turns-out: %s\n", strerror(errno));
        return -1;
    }
    return 0;
}

int turns_out_close(FILE *f, const char *path) {
    if (!f) return 0;
    int bad = ferror(f) != 0;
    if (fclose(f) != 0) bad = 1;
    if (bad) mini_err("--turns-out %s: %s\n", path, strerror(errno));
    return bad ? -1 : 0;
}
