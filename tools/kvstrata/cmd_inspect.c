/* cmd_inspect.c - `kvstrata inspect ssd`: what an SSD tier's directories hold (objects, their model
 * fingerprints, per path use), whether every object is sound (--verify), and dropping what is not
 * (--repair). The reading is backends/ssd/ssd_inspect.c; this file parses the arguments and prints. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "abi/kvstrata_server.h"
#include "backends/ssd/ssd_inspect.h"
#include "cli_util.h"
#include "common/key.h"
#include "common/log.h"
#include "common/progress.h"
#include "inspect_kv.h"
#include "kvstrata_cmd.h"

#define DEFAULT_LIMIT 20
#define MAX_PATHS     KVS_SSD_INSPECT_MAX_FILES

static void usage(FILE *out) {
    fprintf(
        out,
        "usage: kvstrata inspect ssd [OPTIONS] PATH...\n"
        "       kvstrata inspect ssd [OPTIONS] --config FILE --tier NAME [--rank N]\n\n"
        "What an SSD tier's directories hold: its objects (key, size, the model fingerprint\n"
        "they were saved under, age, where), per fingerprint and per path. PATH is a\n"
        "directory of the tier's `paths:` (or one data file); give every path of the tier,\n"
        "since an object's units are spread over them.\n\n"
        "  --config FILE   take the paths from the ssd tier NAME of this YAML file\n"
        "  --tier NAME     only this tier's files (default: every kvstrata-*.data found)\n"
        "  --rank N        with --config: the tensor-parallel rank {rank} in its paths stands\n"
        "                  for (default 0)\n"
        "  --verify        read every object and check its checksums; changes nothing\n"
        "  --repair        verify, then drop what is damaged as the tier would (refused while\n"
        "                  a process has the tier open)\n"
        "  --list          every object (default: the first %d)\n"
        "  --limit N       at most N objects (damage: at least 1000 lines)\n"
        "  --json          one JSON document on stdout\n"
        "  -h, --help      this text\n\n"
        "Exit status: 0 sound, 1 damage found (or left after --repair, or a refusal), 2 usage.\n"
        "Listing and --verify only read; they work while the tier runs.\n",
        DEFAULT_LIMIT);
}

typedef struct fp_total {
    int kv;
    kvs_key fingerprint;
    uint64_t objects, bytes;
} fp_total;

typedef struct printer {
    int json;
    uint64_t limit; /* objects and damage lines shown */
    uint64_t objects_seen, objects_shown, damage_seen, damage_shown;
    fp_total *fps;
    size_t n_fps, cap_fps;
    int out_of_memory;
    const kvs_ssd_inspect_report *rep;
    uint64_t now_ns;
} printer;

static void json_string(const char *s) {
    putchar('"');
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        if (*c == '"' || *c == '\\')
            printf("\\%c", *c);
        else if (*c < 0x20)
            printf("\\u%04x", *c);
        else
            putchar(*c);
    }
    putchar('"');
}

/* "<= 3.2 h": an object is no older than the open of the tier that wrote it. */
static void format_age(char *buf, size_t len, uint64_t written_after_ns, uint64_t now_ns) {
    if (!written_after_ns) {
        snprintf(buf, len, "?");
        return;
    }
    double s = now_ns > written_after_ns ? (double)(now_ns - written_after_ns) / 1e9 : 0.0;
    if (s >= 172800.0)
        snprintf(buf, len, "<= %.1f d", s / 86400.0);
    else if (s >= 5400.0)
        snprintf(buf, len, "<= %.1f h", s / 3600.0);
    else if (s >= 90.0)
        snprintf(buf, len, "<= %.0f min", s / 60.0);
    else
        snprintf(buf, len, "<= %.0f s", s);
}

static void count_fingerprint(printer *p, const kvs_ssd_inspect_object *o) {
    for (size_t i = 0; i < p->n_fps; i++) {
        fp_total *f = &p->fps[i];
        if (f->kv == o->kv &&
            (!o->kv || !memcmp(&f->fingerprint, &o->fingerprint, sizeof(kvs_key)))) {
            f->objects++;
            f->bytes += o->len;
            return;
        }
    }
    if (p->n_fps == p->cap_fps) {
        size_t cap = p->cap_fps ? 2 * p->cap_fps : 16;
        fp_total *f = realloc(p->fps, cap * sizeof *f);
        if (!f) {
            p->out_of_memory = 1;
            return;
        }
        p->fps = f;
        p->cap_fps = cap;
    }
    p->fps[p->n_fps++] = (fp_total){o->kv, o->fingerprint, 1, o->len};
}

static void on_object(void *ctx, const kvs_ssd_inspect_object *o) {
    printer *p = ctx;
    count_fingerprint(p, o);
    if (p->objects_seen++ >= p->limit) return;
    p->objects_shown++;
    char key[33], fp[33] = "-", size[32], age[32];
    kvs_key_hex(&o->key, key);
    if (o->kv) kvs_key_hex(&o->fingerprint, fp);
    kvs_fmt_bytes(size, sizeof size, o->len);
    format_age(age, sizeof age, o->written_after_ns, p->now_ns);
    const char *file = p->rep->files[o->file].path;
    const char *state = o->dropped ? "dropped" : o->damaged ? "damaged" : "";
    if (p->json) {
        printf("%s\n    {\"key\": \"%s\", \"bytes\": %llu, \"fingerprint\": ",
               p->objects_shown > 1 ? "," : "", key, (unsigned long long)o->len);
        if (o->kv)
            printf("\"%s\", \"layers\": %u, \"tokens\": %u, \"codec\": %u", fp, o->n_layers,
                   o->n_tokens, o->codec);
        else
            printf("null");
        printf(", \"sequence\": %llu, \"written_after_s\": ", (unsigned long long)o->sequence);
        if (o->written_after_ns)
            printf("%.3f", (double)o->written_after_ns / 1e9);
        else
            printf("null");
        printf(", \"units\": %u, \"replicas\": %u, \"file\": ", o->units, o->replicas);
        json_string(file);
        printf(", \"offset\": %llu, \"damaged\": %s, \"dropped\": %s}",
               (unsigned long long)o->offset, o->damaged ? "true" : "false",
               o->dropped ? "true" : "false");
        return;
    }
    if (p->objects_shown == 1)
        printf("\n%-32s %10s %-32s %-12s %s\n", "KEY", "SIZE", "FINGERPRINT", "AGE",
               "WHERE (unit 0)");
    printf("%-32s %10s %-32s %-12s %s@%llu%s%s\n", key, size, fp, age, file,
           (unsigned long long)o->offset, state[0] ? "  " : "", state);
}

typedef struct damage_list {
    kvs_ssd_inspect_damage *items;
    size_t n, cap;
    uint64_t total;
    uint64_t limit;
} damage_list;

/* Damage is kept for the end of the output (the JSON document has it after the objects). */
static void on_damage(void *ctx, const kvs_ssd_inspect_damage *d) {
    damage_list *l = ctx;
    if (l->total++ >= l->limit) return;
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 32;
        kvs_ssd_inspect_damage *p = realloc(l->items, cap * sizeof *p);
        if (!p) return;
        l->items = p;
        l->cap = cap;
    }
    l->items[l->n++] = *d;
}

typedef struct both_ctx {
    printer *p;
    damage_list *d;
} both_ctx;

static void object_cb(void *ctx, const kvs_ssd_inspect_object *o) {
    on_object(((both_ctx *)ctx)->p, o);
}
static void damage_cb(void *ctx, const kvs_ssd_inspect_damage *d) {
    on_damage(((both_ctx *)ctx)->d, d);
}

/* The paths of ssd tier `tier` of config file, {rank} replaced by rank as the tier replaces it;
 * each malloc'd into paths. */
static int paths_from_config(const char *file, const char *tier, int32_t rank, char **paths,
                             uint32_t *n_paths) {
    char err[1024];
    kvs_server_config *config = NULL;
    if (kvs_server_config_load(file, &config, err, sizeof err) != KVS_OK) {
        fprintf(stderr, "kvstrata inspect: %s\n", err);
        return -1;
    }
    const kvs_server_settings *cfg = kvs_server_config_settings(config);
    for (size_t t = 0; t < cfg->n_tiers; t++) {
        const kvs_server_tier *tc = &cfg->tiers[t];
        if (strcmp(tc->name, tier) != 0) continue;
        if (strcmp(tc->type, "ssd") != 0) {
            fprintf(stderr, "kvstrata inspect: tier \"%s\" of %s is of type %s, not ssd\n", tier,
                    file, tc->type);
            kvs_server_config_free(config);
            return -1;
        }
        for (size_t o = 0; o < tc->n_options && *n_paths < MAX_PATHS; o++) {
            if (strcmp(tc->options[o].key, "path") != 0) continue;
            if (!(paths[*n_paths] = cli_with_rank(tc->options[o].value, rank))) {
                fprintf(stderr, "kvstrata inspect: out of memory\n");
                kvs_server_config_free(config);
                return -1;
            }
            (*n_paths)++;
        }
        kvs_server_config_free(config);
        return 0;
    }
    fprintf(stderr, "kvstrata inspect: %s has no tier named \"%s\"\n", file, tier);
    kvs_server_config_free(config);
    return -1;
}

static void print_text(const kvs_ssd_inspect_report *rep, const printer *p, const damage_list *dl,
                       int mode) {
    char a[32], b[32], c[32];
    if (p->objects_seen > p->objects_shown)
        printf("... %llu more objects (--list for all, --limit N)\n",
               (unsigned long long)(p->objects_seen - p->objects_shown));
    printf("\nPATH%*s %8s %10s %10s %10s  NOTE\n", 56, "", "OBJECTS", "USED", "CAPACITY", "FILE");
    for (uint32_t i = 0; i < rep->n_files; i++) {
        const kvs_ssd_inspect_file *f = &rep->files[i];
        kvs_fmt_bytes(a, sizeof a, f->bytes);
        kvs_fmt_bytes(b, sizeof b, f->capacity);
        kvs_fmt_bytes(c, sizeof c, f->file_bytes);
        char note[400] = "";
        if (f->in_use && f->in_use_pid)
            snprintf(note, sizeof note, "open in process %d; ", f->in_use_pid);
        else if (f->in_use)
            snprintf(note, sizeof note, "open in another process; ");
        snprintf(note + strlen(note), sizeof note - strlen(note), "%s", f->note);
        printf("%-60s %8llu %10s %10s %10s  %s\n", f->path, (unsigned long long)f->objects, a, b, c,
               note);
    }
    printf("\n%-32s %8s %10s\n", "FINGERPRINT", "OBJECTS", "BYTES");
    for (size_t i = 0; i < p->n_fps; i++) {
        char fp[33];
        if (p->fps[i].kv)
            kvs_key_hex(&p->fps[i].fingerprint, fp);
        else
            snprintf(fp, sizeof fp, "(not a KV object)");
        kvs_fmt_bytes(a, sizeof a, p->fps[i].bytes);
        printf("%-32s %8llu %10s\n", fp, (unsigned long long)p->fps[i].objects, a);
    }
    if (dl->total) {
        printf("\nDAMAGE\n");
        for (size_t i = 0; i < dl->n; i++) {
            const kvs_ssd_inspect_damage *d = &dl->items[i];
            printf("%s offset %llu: %s%s\n", rep->files[d->file].path,
                   (unsigned long long)d->offset, d->what,
                   !d->dropped      ? ""
                   : d->object_kept ? "; this copy retired, the object kept"
                                    : "; dropped");
        }
        if (dl->total > dl->n)
            printf("... %llu more (--list for all)\n", (unsigned long long)(dl->total - dl->n));
    }
    kvs_fmt_bytes(a, sizeof a, rep->bytes);
    kvs_fmt_bytes(b, sizeof b, rep->capacity);
    printf("\n%llu objects, %s in %u files of %s capacity; %llu unit headers belong to no object "
           "(superseded, removed or unfinished writes: free slots)\n",
           (unsigned long long)rep->objects, a, rep->n_files, b,
           (unsigned long long)rep->stray_units);
    if (mode == KVS_SSD_INSPECT_LIST)
        printf("%llu damaged (from the headers; --verify checks the data)\n",
               (unsigned long long)rep->damaged);
    else if (mode == KVS_SSD_INSPECT_VERIFY)
        printf("verified: %llu damaged; nothing was changed\n", (unsigned long long)rep->damaged);
    else
        printf("repaired: %llu damaged, %llu dropped%s\n", (unsigned long long)rep->damaged,
               (unsigned long long)rep->dropped,
               rep->damaged > rep->dropped ? " (the rest is left for the tier: see DAMAGE)" : "");
    if (rep->in_use && mode != KVS_SSD_INSPECT_REPAIR)
        printf("note: a process has the tier open; this was read while it runs, and an object it "
               "rewrote meanwhile is not counted as damage\n");
}

static void print_json(const kvs_ssd_inspect_report *rep, const printer *p, const damage_list *dl,
                       int mode, const char *refused) {
    printf("\n  ],\n  \"objects_listed\": %llu,\n  \"paths\": [",
           (unsigned long long)p->objects_shown);
    for (uint32_t i = 0; i < rep->n_files; i++) {
        const kvs_ssd_inspect_file *f = &rep->files[i];
        printf("%s\n    {\"file\": ", i ? "," : "");
        json_string(f->path);
        printf(", \"tier\": ");
        json_string(f->tier);
        printf(", \"superblock_ok\": %s, \"objects\": %llu, \"units\": %llu, \"bytes\": %llu, "
               "\"capacity\": %llu, \"file_bytes\": %llu, \"stripe_bytes\": %llu, \"slots\": %llu, "
               "\"mtime_s\": %.3f, \"in_use\": %s, \"in_use_pid\": %d, \"note\": ",
               f->superblock_ok ? "true" : "false", (unsigned long long)f->objects,
               (unsigned long long)f->units, (unsigned long long)f->bytes,
               (unsigned long long)f->capacity, (unsigned long long)f->file_bytes,
               (unsigned long long)f->stripe_bytes, (unsigned long long)f->n_slots,
               (double)f->mtime_ns / 1e9, f->in_use ? "true" : "false", f->in_use_pid);
        json_string(f->note);
        printf("}");
    }
    printf("\n  ],\n  \"fingerprints\": [");
    for (size_t i = 0; i < p->n_fps; i++) {
        char fp[33];
        kvs_key_hex(&p->fps[i].fingerprint, fp);
        printf("%s\n    {\"fingerprint\": ", i ? "," : "");
        if (p->fps[i].kv)
            printf("\"%s\"", fp);
        else
            printf("null");
        printf(", \"objects\": %llu, \"bytes\": %llu}", (unsigned long long)p->fps[i].objects,
               (unsigned long long)p->fps[i].bytes);
    }
    printf("\n  ],\n  \"damage\": [");
    for (size_t i = 0; i < dl->n; i++) {
        const kvs_ssd_inspect_damage *d = &dl->items[i];
        printf("%s\n    {\"file\": ", i ? "," : "");
        json_string(rep->files[d->file].path);
        printf(", \"offset\": %llu, \"key\": ", (unsigned long long)d->offset);
        if (d->has_key) {
            char key[33];
            kvs_key_hex(&d->key, key);
            printf("\"%s\"", key);
        } else {
            printf("null");
        }
        printf(", \"what\": ");
        json_string(d->what);
        printf(", \"dropped\": %s, \"object_kept\": %s}", d->dropped ? "true" : "false",
               d->object_kept ? "true" : "false");
    }
    printf("\n  ],\n  \"summary\": {\"mode\": \"%s\", \"objects\": %llu, \"bytes\": %llu, "
           "\"capacity\": %llu, \"damaged\": %llu, \"dropped\": %llu, \"damage_reports\": %llu, "
           "\"stray_units\": %llu, \"headers_read\": %llu, \"checked_bytes\": %llu, \"in_use\": "
           "%s, \"refused\": ",
           mode == KVS_SSD_INSPECT_LIST     ? "list"
           : mode == KVS_SSD_INSPECT_VERIFY ? "verify"
                                            : "repair",
           (unsigned long long)rep->objects, (unsigned long long)rep->bytes,
           (unsigned long long)rep->capacity, (unsigned long long)rep->damaged,
           (unsigned long long)rep->dropped, (unsigned long long)dl->total,
           (unsigned long long)rep->stray_units, (unsigned long long)rep->headers_read,
           (unsigned long long)rep->checked_bytes, rep->in_use ? "true" : "false");
    if (refused)
        json_string(refused);
    else
        printf("null");
    printf("}\n}\n");
}

static int inspect_ssd(int argc, char **argv) {
    static const struct option long_opts[] = {
        {"config", required_argument, NULL, 'c'}, {"tier", required_argument, NULL, 't'},
        {"rank", required_argument, NULL, 'k'},   {"verify", no_argument, NULL, 'v'},
        {"repair", no_argument, NULL, 'r'},       {"list", no_argument, NULL, 'l'},
        {"limit", required_argument, NULL, 'n'},  {"json", no_argument, NULL, 'j'},
        {"help", no_argument, NULL, 'h'},         {NULL, 0, NULL, 0}};
    const char *config = NULL, *tier = NULL;
    int mode = KVS_SSD_INSPECT_LIST, json = 0, rank_given = 0;
    int32_t rank = 0;
    uint64_t limit = DEFAULT_LIMIT;
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, "h", long_opts, NULL)) != -1) {
        switch (c) {
            case 'c': config = optarg; break;
            case 't': tier = optarg; break;
            case 'k':
                if (cli_parse_rank("inspect", optarg, &rank) != 0) return 2;
                rank_given = 1;
                break;
            case 'v':
                if (mode != KVS_SSD_INSPECT_REPAIR) mode = KVS_SSD_INSPECT_VERIFY;
                break;
            case 'r': mode = KVS_SSD_INSPECT_REPAIR; break;
            case 'l': limit = UINT64_MAX; break;
            case 'n': {
                char *end;
                limit = strtoull(optarg, &end, 10);
                if (*end || !*optarg) {
                    fprintf(stderr, "kvstrata inspect: --limit takes a number, not '%s'\n", optarg);
                    return 2;
                }
                break;
            }
            case 'j': json = 1; break;
            case 'h': usage(stdout); return 0;
            default: usage(stderr); return 2;
        }
    }
    const char *paths[MAX_PATHS];
    char *owned[MAX_PATHS]; /* the paths of --config, {rank} replaced */
    uint32_t n_paths = 0, n_owned = 0;
    if (rank_given && !config) {
        fprintf(stderr, "kvstrata inspect: --rank goes with --config (give PATHs as they are)\n");
        return 2;
    }
    if (config) {
        if (!tier) {
            fprintf(stderr, "kvstrata inspect: --config needs --tier NAME (the ssd tier)\n");
            return 2;
        }
        if (optind < argc) {
            fprintf(stderr, "kvstrata inspect: give paths or --config, not both\n");
            return 2;
        }
        if (paths_from_config(config, tier, rank, owned, &n_owned) != 0) {
            for (uint32_t i = 0; i < n_owned; i++) free(owned[i]);
            return 2;
        }
        for (uint32_t i = 0; i < n_owned; i++) paths[n_paths++] = owned[i];
    } else {
        for (int i = optind; i < argc && n_paths < MAX_PATHS; i++) paths[n_paths++] = argv[i];
    }
    if (n_paths == 0) {
        usage(stderr);
        for (uint32_t i = 0; i < n_owned; i++) free(owned[i]);
        return 2;
    }

    kvs_ssd_inspect_report *rep = calloc(1, sizeof *rep);
    if (!rep) {
        fprintf(stderr, "kvstrata inspect: out of memory\n");
        for (uint32_t i = 0; i < n_owned; i++) free(owned[i]);
        return 1;
    }
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    printer pr = {.json = json,
                  .limit = limit,
                  .rep = rep,
                  .now_ns = (uint64_t)now.tv_sec * 1000000000ull + (uint64_t)now.tv_nsec};
    damage_list dl = {.limit = limit > 1000 ? limit : 1000}; /* damage is never hidden by default */
    both_ctx both = {&pr, &dl};
    kvs_progress progress = {0};
    if (mode != KVS_SSD_INSPECT_LIST)
        kvs_progress_begin(&progress, stderr, 0,
                           mode == KVS_SSD_INSPECT_VERIFY ? "verifying" : "verifying for repair",
                           "objects", 0, 500, 0);
    kvs_ssd_inspect_options opt = {.mode = mode,
                                   .tier = tier,
                                   .progress = mode != KVS_SSD_INSPECT_LIST ? &progress : NULL,
                                   .on_object = object_cb,
                                   .on_damage = damage_cb,
                                   .ctx = &both,
                                   .content = cli_inspect_kv_content()};
    if (json) printf("{\n  \"objects\": [");
    char err[1024];
    kvs_status rc = kvs_ssd_inspect_run(paths, n_paths, &opt, rep, err, sizeof err);
    if (mode != KVS_SSD_INSPECT_LIST) {
        char note[64];
        snprintf(note, sizeof note, "%llu damaged", (unsigned long long)rep->damaged);
        kvs_progress_end(&progress, note);
    }
    int status;
    if (rc != KVS_OK) {
        fprintf(stderr, "kvstrata inspect: %s\n", err);
        if (json) print_json(rep, &pr, &dl, mode, err);
        status = 1;
    } else {
        if (json)
            print_json(rep, &pr, &dl, mode, NULL);
        else
            print_text(rep, &pr, &dl, mode);
        status = mode == KVS_SSD_INSPECT_REPAIR ? rep->damaged > rep->dropped : rep->damaged > 0;
    }
    if (pr.out_of_memory) fprintf(stderr, "kvstrata inspect: out of memory for the fingerprints\n");
    free(pr.fps);
    free(dl.items);
    free(rep);
    for (uint32_t i = 0; i < n_owned; i++) free(owned[i]);
    return status;
}

int kvs_cmd_inspect(int argc, char **argv) {
    if (argc >= 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        usage(stdout);
        return 0;
    }
    if (argc < 2 || strcmp(argv[1], "ssd") != 0) {
        fprintf(stderr, "kvstrata inspect: say what to inspect: `kvstrata inspect ssd PATH...`\n");
        usage(stderr);
        return 2;
    }
    return inspect_ssd(argc - 1, argv + 1);
}
