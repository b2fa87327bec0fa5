#include "cli_util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "backends/redis/redis.h"
#include "backends/ucx/remote.h"
#include "common/log.h"

const char *cli_tier_option(const kvs_server_tier *tc, const char *key, int nth) {
    for (size_t i = 0; i < tc->n_options; i++) {
        const kvs_server_option *o = &tc->options[i];
        if (strcmp(o->key, key) != 0) continue;
        if (nth < 0 || o->list_index == nth) return o->value;
    }
    return NULL;
}

uint32_t cli_tier_list_count(const kvs_server_tier *tc, const char *key) {
    uint32_t n = 0;
    for (size_t i = 0; i < tc->n_options; i++)
        if (!strcmp(tc->options[i].key, key) && tc->options[i].list_index >= 0) n++;
    return n;
}

int cli_free_bytes(const char *path, uint64_t *free_bytes) {
    char dir[KVS_SERVER_PATH_MAX];
    snprintf(dir, sizeof dir, "%s", path[0] ? path : ".");
    for (;;) {
        struct statvfs sv;
        if (statvfs(dir, &sv) == 0) {
            *free_bytes = (uint64_t)sv.f_bavail * (uint64_t)sv.f_frsize;
            return 0;
        }
        if (errno != ENOENT || !strcmp(dir, "/") || !strcmp(dir, ".")) return -1;
        char *slash = strrchr(dir, '/'); /* not there yet: its parent's file system */
        if (!slash)
            snprintf(dir, sizeof dir, ".");
        else if (slash == dir)
            dir[1] = '\0';
        else
            *slash = '\0';
    }
}

uint64_t cli_mem_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return 0;
    char line[256];
    unsigned long long kib = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kib) == 1) break;
    fclose(f);
    return (uint64_t)kib * 1024;
}

void cli_json_string(FILE *out, const char *s) {
    fputc('"', out);
    for (const unsigned char *p = (const unsigned char *)(s ? s : ""); *p; p++) {
        if (*p == '"' || *p == '\\')
            fprintf(out, "\\%c", *p);
        else if (*p == '\n')
            fputs("\\n", out);
        else if (*p < 0x20)
            fprintf(out, "\\u%04x", *p);
        else
            fputc(*p, out);
    }
    fputc('"', out);
}

char *cli_with_rank(const char *value, int32_t rank) {
    char num[16];
    size_t num_len = (size_t)snprintf(num, sizeof num, "%d", (int)rank), n = 0;
    for (const char *p = value; (p = strstr(p, "{rank}")) != NULL; p += 6) n++;
    char *out = malloc(strlen(value) + n * num_len + 1);
    if (!out) return NULL;
    size_t o = 0;
    for (const char *p = value; *p;) {
        if (!strncmp(p, "{rank}", 6)) {
            memcpy(out + o, num, num_len);
            o += num_len;
            p += 6;
        } else {
            out[o++] = *p++;
        }
    }
    out[o] = '\0';
    return out;
}

int cli_parse_rank(const char *cmd, const char *text, int32_t *rank) {
    char *end;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (errno || end == text || *end || v < 0 || v > 65535) {
        fprintf(stderr, "kvstrata %s: --rank takes a rank from 0 to 65535, not '%s'\n", cmd, text);
        return -1;
    }
    *rank = (int32_t)v;
    return 0;
}

int cli_is_file(const char *s) {
    struct stat sb;
    return stat(s, &sb) == 0 && S_ISREG(sb.st_mode);
}

kvs_status cli_open_tier(const kvs_server_config *cfg, size_t i, uint64_t max_object_bytes,
                         int32_t rank, kvs_server_tiers **chain, char *err, size_t err_len) {
    return kvs_server_tier_open(cfg, (uint32_t)i, max_object_bytes, rank, chain, err, err_len);
}

uint32_t cli_servers_down(const kvs_server_tier *tc, kvs_server_tiers *chain, uint32_t *all) {
    void *state = kvs_server_tiers_state(chain, 0);
    *all = 0;
    if (kvs_server_tiers_degraded(chain, 0)[0]) return 0;
    if (!strcmp(tc->type, "redis")) {
        kvs_redis_stats_t rs;
        if (kvs_redis_stats(state, &rs) != KVS_OK) return 0;
        *all = rs.n_masters;
        return rs.masters_down;
    }
    if (!strcmp(tc->type, "remote")) {
        kvs_remote_stats_t rs;
        if (kvs_remote_stats(state, &rs) != KVS_OK) return 0;
        *all = rs.n_nodes;
        return rs.n_nodes - rs.nodes_up;
    }
    return 0;
}

int cli_file_locked(const char *file) {
    int fd = open(file, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    int rc = flock(fd, LOCK_EX | LOCK_NB);
    int err = errno;
    if (rc == 0) flock(fd, LOCK_UN);
    close(fd);
    errno = err;
    return rc == 0 ? 0 : (err == EWOULDBLOCK ? 1 : -1);
}

int cli_tier_paths(const kvs_server_tier *tc, int32_t rank, char **paths, uint32_t cap,
                   uint32_t *n) {
    uint32_t count = cli_tier_list_count(tc, "path");
    *n = 0;
    for (uint32_t k = 0; k < count && k < cap; k++) {
        if (!(paths[k] = cli_with_rank(cli_tier_option(tc, "path", (int)k), rank))) {
            cli_free_paths(paths, k);
            return -1;
        }
        *n = k + 1;
    }
    return 0;
}

void cli_free_paths(char **paths, uint32_t n) {
    for (uint32_t k = 0; k < n; k++) free(paths[k]);
}
