/* bench_lookup.c - cost of the scheduler's lookup per chunk against a DRAM tier index holding many
 * chunks, against computing the same chunk keys alone (kvs_keys_chain), measured in the same run.
 *
 * The tier is filled directly (backend put, no engine pages involved) with header-only objects under
 * the keys of synthetic requests of --prefix chunks each; a lookup never reads an object's bytes, only
 * the index and the slab table. A hit lookup is a request whose whole prompt is stored (it pins and
 * counts every chunk); a miss lookup is a request whose first chunk is absent. Each lookup is followed
 * by request_finished, which releases the lease, and both are timed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>

#include "bench_common.h"
#include "connector/handle.h"
#include "connector/keys.h"
#include "connector/object.h"
#include "connector/tiers.h"

#define CHUNK_TOKENS    256u
#define BLOCK_TOKENS    16u
#define VOCAB           128256u
#define DEFAULT_CHUNKS  1048576ull
#define FALLBACK_CHUNKS 262144ull
#define MISS_SEED_BASE  (1ull << 40) /* sequence seeds never used for stored requests */

typedef struct options {
    uint64_t chunks;   /* stored in the tier */
    uint64_t prefix;   /* chunks per request */
    uint64_t requests; /* distinct requests per measured round */
    uint32_t iters;
    uint32_t warmup;
    int chunks_given;
} options;

static void usage(const char *prog) {
    fprintf(
        stderr,
        "usage: %s [--chunks N] [--prefix P] [--requests Q] [--iters R] [--warmup W]\n"
        "  --chunks    chunks stored in the DRAM tier (default %llu; %llu when memory is short)\n"
        "  --prefix    chunks per request, all stored for a hit (default 64)\n"
        "  --requests  distinct requests per measured round (default 1024)\n"
        "  --iters     measured rounds, median reported (default 7)\n"
        "  --warmup    unmeasured rounds first (default 1)\n",
        prog, DEFAULT_CHUNKS, FALLBACK_CHUNKS);
}

static options parse_options(int argc, char **argv) {
    options o = {.chunks = DEFAULT_CHUNKS, .prefix = 64, .requests = 1024, .iters = 7, .warmup = 1};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--chunks") == 0) {
            o.chunks = bench_parse_u64(a, v, 1, 1ull << 28);
            o.chunks_given = 1;
        } else if (strcmp(a, "--prefix") == 0)
            o.prefix = bench_parse_u64(a, v, 1, 4096);
        else if (strcmp(a, "--requests") == 0)
            o.requests = bench_parse_u64(a, v, 1, 1u << 20);
        else if (strcmp(a, "--iters") == 0)
            o.iters = (uint32_t)bench_parse_u64(a, v, 1, 100000);
        else if (strcmp(a, "--warmup") == 0)
            o.warmup = (uint32_t)bench_parse_u64(a, v, 0, 100000);
        else {
            usage(argv[0]);
            exit(strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0 ? 0 : 2);
        }
        i++;
    }
    return o;
}

/* MemAvailable from /proc/meminfo in bytes, or 0 if it cannot be read. */
static uint64_t mem_available_bytes(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    unsigned long long kib = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kib) == 1) break;
    if (f) fclose(f);
    return (uint64_t)kib * 1024;
}

/* Resident memory the stored chunks cost: one 4 KiB page of slab data (objects are one page; huge
 * pages are off, see main), the 48-byte slab entry and two 4-byte hash buckets. */
static uint64_t resident_bytes(uint64_t chunks) {
    return chunks * (4096 + 48 + 8);
}

/* The tokens of synthetic request `seed`: prefix full chunks. */
static void make_tokens(uint64_t seed, uint64_t n_tokens, int32_t *out) {
    uint64_t s = bench_mix64(seed);
    /* Multiply-shift instead of %: filling a million chunks is mostly token generation otherwise. */
    for (uint64_t i = 0; i < n_tokens; i++)
        out[i] = (int32_t)(((bench_mix64(s ^ i) >> 32) * VOCAB) >> 32);
}

static double per_chunk(uint64_t ns, const options *o) {
    return (double)ns / (double)(o->requests * o->prefix);
}

typedef struct round_time {
    uint64_t hash_ns, hit_ns, miss_ns;
    uint64_t hit_tokens, miss_tokens; /* offered by the lookups, checked by the caller */
} round_time;

static volatile uint8_t sink;

static uint64_t lookup_once(const kvs_api *api, kvs_handle *h, const int32_t *tokens,
                            uint64_t n_tokens, uint64_t *offered) {
    kvs_lookup_result res = {.struct_size = sizeof res};
    int keep = 0;
    uint64_t t0 = bench_now_ns();
    BENCH_CHECK(api, h, api->lookup(h, "bench", tokens, n_tokens, 0, &res));
    BENCH_CHECK(api, h, api->request_finished(h, "bench", &keep));
    uint64_t t1 = bench_now_ns();
    *offered += res.n_hit_tokens;
    return t1 - t0;
}

/* One round: every request once in each of the three measurements, interleaved request by request so
 * a noisy neighbour slows all three alike. The hit lookup takes the request half a round away from
 * the one just hashed, so neither finds the other's tokens in cache. */
static round_time run_round(const kvs_api *api, kvs_handle *h, const options *o,
                            const int32_t *hit_tokens, const int32_t *miss_tokens, kvs_key *keys) {
    uint64_t n_tokens = o->prefix * CHUNK_TOKENS;
    round_time t = {0};
    for (uint64_t r = 0; r < o->requests; r++) {
        uint64_t t0 = bench_now_ns();
        kvs_keys_chain(&h->fingerprint, hit_tokens + r * n_tokens, o->prefix, CHUNK_TOKENS, keys);
        t.hash_ns += bench_now_ns() - t0;
        sink = (uint8_t)(sink ^ keys[o->prefix - 1].bytes[0]);
        uint64_t other = (r + o->requests / 2) % o->requests;
        t.hit_ns += lookup_once(api, h, hit_tokens + other * n_tokens, n_tokens, &t.hit_tokens);
        t.miss_ns += lookup_once(api, h, miss_tokens + r * n_tokens, n_tokens, &t.miss_tokens);
    }
    return t;
}

int main(int argc, char **argv) {
    options o = parse_options(argc, argv);
    char note[256] = "";
    uint64_t avail = mem_available_bytes();
    uint64_t need = resident_bytes(o.chunks) + (2ull << 30); /* tokens, keys, headroom */
    if (!o.chunks_given && avail && avail < need) {
        snprintf(note, sizeof note, "only %llu MiB available: %llu chunks instead of %llu",
                 (unsigned long long)(avail >> 20), FALLBACK_CHUNKS, DEFAULT_CHUNKS);
        o.chunks = FALLBACK_CHUNKS;
    }
    if (o.chunks < o.prefix) {
        fprintf(stderr, "--chunks %llu is fewer than one request of --prefix %llu chunks\n",
                (unsigned long long)o.chunks, (unsigned long long)o.prefix);
        return 2;
    }
    uint64_t n_sequences = o.chunks / o.prefix;
    o.chunks = n_sequences * o.prefix; /* whole requests only */

    /* The tier madvises its slab data for huge pages, so a one-page object would pin a 2 MiB page.
     * Lookups never touch slab data, and with THP in `madvise` mode the index and slab table are on
     * 4 KiB pages either way, so turning THP off here changes the memory bill, not the figures. */
    int thp_off = prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0) == 0;

    const kvs_api *api = kvs_get_api(KVS_ABI_MAJOR);
    if (!api) {
        fprintf(stderr, "kvs_get_api(%d) returned NULL\n", KVS_ABI_MAJOR);
        return 1;
    }
    kvs_model_desc model = {.struct_size = sizeof model,
                            .model_id = "kvs-bench/lookup-tiny",
                            .dtype = KVS_DTYPE_FP16,
                            .n_layers = 1,
                            .n_kv_heads = 1,
                            .head_dim = 8,
                            .block_tokens = BLOCK_TOKENS,
                            .tp_size = 1,
                            .vocab_size = VOCAB};
    uint64_t layer_bytes = 2ull * CHUNK_TOKENS * 8 * 2; /* K+V, 1 head, dim 8, fp16 */
    uint64_t object_bytes = kvs_object_bytes(1, layer_bytes);
    uint64_t slab = (object_bytes + 4095) / 4096 * 4096;
    uint32_t header_bytes = kvs_object_payload_offset(1);
    char yaml[1024], path[512], err[KVS_ERROR_MAX];
    snprintf(yaml, sizeof yaml,
             "version: 1\nchunk_tokens: %u\nlease_timeout_ms: 600000\nlog_level: warn\n"
             "tiers:\n  - name: dram\n    type: dram\n    capacity: %llu\n",
             CHUNK_TOKENS, (unsigned long long)(slab * o.chunks));
    bench_write_temp(yaml, path, sizeof path);
    kvs_open_params params = {.struct_size = sizeof params,
                              .role = KVS_ROLE_SCHEDULER,
                              .config_path = path,
                              .model = &model};
    kvs_handle *h = NULL;
    kvs_status st = api->open(&params, &h, err, sizeof err);
    remove(path);
    if (st != KVS_OK) {
        fprintf(stderr, "open failed: %s: %s\n", api->strerror(st), err);
        return 1;
    }

    uint64_t n_tokens = o.prefix * CHUNK_TOKENS;
    int32_t *tokens = malloc(n_tokens * sizeof *tokens);
    int32_t *hit_tokens = malloc(o.requests * n_tokens * sizeof *hit_tokens);
    int32_t *miss_tokens = malloc(o.requests * n_tokens * sizeof *miss_tokens);
    kvs_key *keys = malloc(o.prefix * sizeof *keys);
    uint8_t *object = calloc(1, header_bytes);
    if (!tokens || !hit_tokens || !miss_tokens || !keys || !object) {
        fprintf(stderr, "out of memory\n");
        return 1;
    }

    /* Fill the tier: header-only objects (one page), put straight into tier 0. */
    const kvs_backend_ops *ops = kvs_tiers_ops(h->tiers, 0);
    void *tier = kvs_tiers_state(h->tiers, 0);
    uint64_t fill0 = bench_now_ns();
    for (uint64_t s = 0; s < n_sequences; s++) {
        make_tokens(s, n_tokens, tokens);
        kvs_keys_chain(&h->fingerprint, tokens, o.prefix, CHUNK_TOKENS, keys);
        for (uint64_t c = 0; c < o.prefix; c++) {
            kvs_object_init(object, &h->fingerprint, &keys[c], 1, CHUNK_TOKENS, layer_bytes);
            kvs_object_seal(object);
            if ((st = ops->put(tier, &keys[c], object, header_bytes)) != KVS_OK) {
                fprintf(stderr, "put of chunk %llu failed: %s: %s\n",
                        (unsigned long long)(s * o.prefix + c), api->strerror(st),
                        ops->last_error(tier));
                return 1;
            }
        }
    }
    uint64_t fill_ns = bench_now_ns() - fill0;
    uint64_t n_objects = 0, tier_bytes = 0;
    BENCH_CHECK(api, h, ops->usage(tier, &n_objects, &tier_bytes));
    if (n_objects != o.chunks) {
        fprintf(stderr, "the tier holds %llu objects, expected %llu\n",
                (unsigned long long)n_objects, (unsigned long long)o.chunks);
        return 1;
    }

    /* The measured requests: stored ones spread over the whole index, and never-stored ones. */
    for (uint64_t r = 0; r < o.requests; r++) {
        make_tokens(bench_mix64(0x100c ^ r) % n_sequences, n_tokens, hit_tokens + r * n_tokens);
        make_tokens(MISS_SEED_BASE + r, n_tokens, miss_tokens + r * n_tokens);
    }

    uint32_t n = o.iters;
    double *hash = calloc(n, sizeof *hash), *hit = calloc(n, sizeof *hit),
           *miss = calloc(n, sizeof *miss);
    if (!hash || !hit || !miss) {
        fprintf(stderr, "out of memory\n");
        return 1;
    }
    /* A full-prompt hit reports one token less: the engine computes the last token itself. */
    uint64_t want_hit = o.requests * (n_tokens - 1);
    for (uint32_t i = 0; i < o.warmup + n; i++) {
        round_time t = run_round(api, h, &o, hit_tokens, miss_tokens, keys);
        if (t.hit_tokens != want_hit || t.miss_tokens != 0) {
            fprintf(stderr, "lookups offered %llu hit and %llu miss tokens, expected %llu and 0\n",
                    (unsigned long long)t.hit_tokens, (unsigned long long)t.miss_tokens,
                    (unsigned long long)want_hit);
            return 1;
        }
        if (i < o.warmup) continue;
        hash[i - o.warmup] = per_chunk(t.hash_ns, &o);
        hit[i - o.warmup] = per_chunk(t.hit_ns, &o);
        miss[i - o.warmup] = per_chunk(t.miss_ns, &o);
    }
    kvs_stats stats = {.struct_size = sizeof stats};
    BENCH_CHECK(api, h, api->stats(h, &stats));
    if (stats.leases_active != 0) {
        fprintf(stderr, "%llu leases still active after request_finished\n",
                (unsigned long long)stats.leases_active);
        return 1;
    }

    double hash_ns = bench_median(hash, n), hit_ns = bench_median(hit, n),
           miss_ns = bench_median(miss, n);
    const char *kinds[2] = {"lookup_hit", "lookup_miss"};
    const double figures[2] = {hit_ns, miss_ns};
    for (int k = 0; k < 2; k++) {
        printf(
            "{\"bench\":\"%s\",\"ratio\":%.3f,\"reference\":\"kvs_keys_chain over the same "
            "tokens\","
            "\"ns_per_chunk\":%.1f,\"reference_ns_per_chunk\":%.1f,\"ns_per_lookup\":%.0f,"
            "\"chunks_per_lookup\":%llu,\"index_chunks\":%llu,\"requests\":%llu,\"iterations\":%u,"
            "\"warmup\":%u,\"bytes_hashed_per_chunk\":%u,\"fill_s\":%.2f,\"thp_disabled\":%s,"
            "\"note\":\"%s\"}\n",
            kinds[k], figures[k] / hash_ns, figures[k], hash_ns, figures[k] * (double)o.prefix,
            (unsigned long long)o.prefix, (unsigned long long)o.chunks,
            (unsigned long long)o.requests, n, o.warmup, CHUNK_TOKENS * 4, (double)fill_ns / 1e9,
            thp_off ? "true" : "false", note);
        printf("%s: %.1f ns per chunk (%.2f us per %llu-chunk lookup + request_finished), key "
               "hashing alone "
               "%.1f ns per chunk, ratio %.3f, index of %llu chunks%s%s\n",
               kinds[k], figures[k], figures[k] * (double)o.prefix / 1e3,
               (unsigned long long)o.prefix, hash_ns, figures[k] / hash_ns,
               (unsigned long long)o.chunks, note[0] ? "; " : "", note);
    }

    api->close(h);
    free(tokens);
    free(hit_tokens);
    free(miss_tokens);
    free(keys);
    free(object);
    free(hash);
    free(hit);
    free(miss);
    return 0;
}
