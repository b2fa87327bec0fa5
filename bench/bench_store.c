/* bench_store.c - the store API (abi/kvstrata_store.h) driven as an engine drives it: reached from
 * kvs_get_api(1)->store_api(1), opened with a namespace on a YAML file, the engine's host buffers
 * (2 MiB huge-page-advised anonymous maps, faulted in) registered once, batches of 64-hex-character
 * keys (SGLang's page hashes) submitted and waited for. Against references measured in the same run:
 *
 * 1. dram: store_put of --pages pages of each --sizes MiB (submit all, then wait) into a store whose
 *    only tier is a dram tier holding the data set, and store_get of them into other registered
 *    buffers. Reference: the same bytes copied between the same buffers with memcpy and with
 *    non-temporal stores (the store copies with those), each by one thread and by as many as the
 *    store runs (--threads, each copying every T-th page); the one with the best median is the
 *    reference, so a ratio is never against a weaker copy. The keys are removed (untimed) before
 *    each put, so every put stores.
 * 2. ssd: the pages put into a store whose only tier is an ssd tier (defaults but for capacity and
 *    write_buffer_bytes) in a directory of --dir; the store is closed and opened again, so the
 *    objects come off the device (O_DIRECT) and nothing of them is in the process; then store_get
 *    of all of them. Reference: fio on the tier's data file (io_uring, direct, fixed buffers):
 *    reads of the page size with as many in flight as the store has gets in flight (one per
 *    thread), and reads of the tier's stripe with as many in flight as the store has unit reads in
 *    flight (the units of one object per thread); each sequential and random; the one with the
 *    best median is the reference.
 * 3. exists of the pages' keys (all present: the leading run is all of them), ns per call, against
 *    hashing the same keys as the store derives them (XXH3-128 of the namespace's 16-byte hash and
 *    the key), streamed in two updates as the store does and in one call over both copied into one
 *    buffer; the faster is the reference (ratio: store time / hash time, lower is better).
 *
 * Rounds alternate the store and its references; each figure is the median of the per-round ratios
 * (and of the per-round absolute figures beside it). Round 0 is untimed and checks every byte of
 * every get. Exit 77 (after the dram and exists lines) when fio is missing or --dir does not take
 * O_DIRECT, or is memory (tmpfs takes O_DIRECT on recent kernels). --only runs one part. */
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include "abi/kvstrata_store.h"
#include "backends/ssd/ssd.h"
#include "bench_common.h"
#include "common/copy.h"
#include "connector/store/store_state.h"
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#define MIB         (1024ull * 1024ull)
#define OBJECT_HEAD 4096ull /* the header page the store puts before every value */
#define KEY_BYTES   64u
#define MAX_SIZES   8u
#define EXISTS_REPS 1000u /* calls of each kind per exists round */
#define NAMESPACE \
    "model=meta-llama/Llama-3.1-8B;dtype=bfloat16;page_size=64;layout=page_first;tp=0/1"

typedef struct options {
    uint32_t rounds;
    uint32_t pages;
    uint32_t threads;
    uint32_t n_sizes;
    uint64_t sizes[MAX_SIZES];
    const char *dir;
    int dram, ssd; /* the parts to run */
} options;

static const kvs_store_api *S;

static void usage(int status) {
    fprintf(status ? stderr : stdout,
            "usage: kvs-bench-store [--rounds N] [--pages N] [--sizes MiB,MiB,...] [--threads T]\n"
            "                       [--dir DIR] [--only dram|ssd]\n"
            "  --rounds  timed rounds of the store and each reference (default 7)\n"
            "  --pages   pages (keys) in every batch (default 128)\n"
            "  --sizes   page sizes in MiB, comma-separated (default 1,2,4)\n"
            "  --threads the store's threads, and the threads of the multi-threaded memcpy\n"
            "            (default 2, the store's default)\n"
            "  --dir     where the ssd tier's data files go (default $KVS_BENCH_DIR, else\n"
            "            /var/tmp); must take O_DIRECT\n"
            "  --only    dram (the dram tier and exists) or ssd: that part alone\n");
    exit(status);
}

static options parse_options(int argc, char **argv) {
    const char *env = getenv("KVS_BENCH_DIR");
    options o = {.rounds = 7,
                 .pages = 128,
                 .threads = 2,
                 .n_sizes = 3,
                 .sizes = {MIB, 2 * MIB, 4 * MIB},
                 .dir = env && *env ? env : "/var/tmp",
                 .dram = 1,
                 .ssd = 1};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) usage(0);
        if (!v) usage(2);
        if (!strcmp(a, "--rounds"))
            o.rounds = (uint32_t)bench_parse_u64(a, v, 1, 1000);
        else if (!strcmp(a, "--pages"))
            o.pages = (uint32_t)bench_parse_u64(a, v, 1, 4096);
        else if (!strcmp(a, "--threads"))
            o.threads = (uint32_t)bench_parse_u64(a, v, 1, KVS_STORE_MAX_THREADS);
        else if (!strcmp(a, "--dir"))
            o.dir = v;
        else if (!strcmp(a, "--only") && (!strcmp(v, "dram") || !strcmp(v, "ssd")))
            o.dram = !strcmp(v, "dram"), o.ssd = !o.dram;
        else if (!strcmp(a, "--sizes")) {
            char text[256], *save = NULL;
            snprintf(text, sizeof text, "%s", v);
            o.n_sizes = 0;
            for (char *t = strtok_r(text, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
                if (o.n_sizes == MAX_SIZES) {
                    fprintf(stderr, "--sizes: at most %u sizes\n", MAX_SIZES);
                    exit(2);
                }
                o.sizes[o.n_sizes++] = bench_parse_u64(a, t, 1, 256) * MIB;
            }
            if (!o.n_sizes) usage(2);
        } else
            usage(2);
        i++;
    }
    return o;
}

static void die(const char *what, const char *why) {
    fprintf(stderr, "kvs-bench-store: %s: %s\n", what, why);
    exit(1);
}

/* --- the engine's side: keys, buffers, batches ------------------------------------------------ */

typedef struct batch {
    char *key_text;    /* pages keys of KEY_BYTES hex characters */
    uint64_t *offsets; /* pages + 1 */
    kvs_store_keys keys;
    uint8_t *src, *dst; /* the engine's host pools: put from src, get into dst */
    kvs_store_iov *put_iov, *get_iov;
    uint64_t *seg;
    kvs_store_result *results;
    uint64_t page, pages;
} batch;

/* Key i of the pages of size `page`: 64 hex characters, as SGLang names a page by its hash. */
static void make_keys(batch *b) {
    static const char hex[] = "0123456789abcdef";
    b->key_text = malloc(b->pages * KEY_BYTES);
    b->offsets = malloc((b->pages + 1) * sizeof *b->offsets);
    if (!b->key_text || !b->offsets) die("keys", "out of memory");
    for (uint64_t i = 0; i < b->pages; i++) {
        uint64_t x = bench_mix64((b->page << 20) ^ i);
        for (uint32_t c = 0; c < KEY_BYTES; c++) {
            if (c % 16 == 0) x = bench_mix64(x + c);
            b->key_text[i * KEY_BYTES + c] = hex[(x >> (4 * (c % 16))) & 15];
        }
        b->offsets[i] = i * KEY_BYTES;
    }
    b->offsets[b->pages] = b->pages * KEY_BYTES;
    b->keys = (kvs_store_keys){.data = b->key_text, .offsets = b->offsets, .n = b->pages};
}

static void fill_page(uint8_t *p, uint64_t bytes, uint64_t page, uint64_t i) {
    uint64_t *w = (uint64_t *)(void *)p, base = (page << 24) ^ (i << 40);
    for (uint64_t k = 0; k < bytes / 8; k++) w[k] = bench_mix64(base + k);
}

static void batch_init(batch *b, uint64_t page, uint64_t pages) {
    memset(b, 0, sizeof *b);
    b->page = page;
    b->pages = pages;
    make_keys(b);
    b->src = bench_map(page * pages, 1, 0, "the put buffers");
    b->dst = bench_map(page * pages, 1, 0, "the get buffers");
    for (uint64_t i = 0; i < pages; i++) fill_page(b->src + i * page, page, page, i);
    b->put_iov = malloc(pages * sizeof *b->put_iov);
    b->get_iov = malloc(pages * sizeof *b->get_iov);
    b->seg = malloc((pages + 1) * sizeof *b->seg);
    b->results = malloc(pages * sizeof *b->results);
    if (!b->put_iov || !b->get_iov || !b->seg || !b->results) die("buffers", "out of memory");
    for (uint64_t i = 0; i < pages; i++) {
        b->put_iov[i] = (kvs_store_iov){b->src + i * page, page};
        b->get_iov[i] = (kvs_store_iov){b->dst + i * page, page};
        b->seg[i] = i;
    }
    b->seg[pages] = pages;
}

static void batch_free(batch *b) {
    munmap(b->src, b->page * b->pages);
    munmap(b->dst, b->page * b->pages);
    free(b->key_text);
    free(b->offsets);
    free(b->put_iov);
    free(b->get_iov);
    free(b->seg);
    free(b->results);
}

typedef struct store {
    kvs_store *s;
    uint64_t regions[2];
    char config[512];
} store;

/* Open a store on `yaml` (written to a temporary file) with the batch's buffers registered. */
static void store_open(store *st, const char *yaml, const batch *b, uint32_t threads) {
    if (!st->config[0]) bench_write_temp(yaml, st->config, sizeof st->config);
    kvs_store_open_params p = {.struct_size = sizeof p,
                               .threads = threads,
                               .config_path = st->config,
                               .namespace_bytes = NAMESPACE,
                               .namespace_len = strlen(NAMESPACE),
                               .max_value_bytes = b->page};
    char err[512] = "";
    kvs_status rc = S->open(&p, &st->s, err, sizeof err);
    if (rc != KVS_OK) {
        fprintf(stderr, "kvs-bench-store: open on\n%s\nfailed: %s (%d): %s\n", yaml,
                kvs_strerror(rc), (int)rc, err);
        exit(1);
    }
    rc = S->register_memory(st->s, b->src, b->page * b->pages, KVS_STORE_MEM_HOST, 0,
                            &st->regions[0]);
    if (rc == KVS_OK)
        rc = S->register_memory(st->s, b->dst, b->page * b->pages, KVS_STORE_MEM_HOST, 0,
                                &st->regions[1]);
    if (rc != KVS_OK) die("register_memory", S->last_error(st->s));
}

static void store_close(store *st, int last) {
    S->unregister_memory(st->s, st->regions[0]);
    S->unregister_memory(st->s, st->regions[1]);
    S->close(st->s);
    st->s = NULL;
    if (last) unlink(st->config), st->config[0] = '\0';
}

/* Submit one batch of op over every key, wait for it; every key must succeed (and a put must store,
 * not skip). Returns the wall time from submit to the end of wait. */
static uint64_t run_batch(store *st, batch *b, uint32_t op, const char *what) {
    kvs_store_sg sg = {.iov = op == KVS_STORE_OP_PUT ? b->put_iov : b->get_iov, .seg = b->seg};
    const kvs_store_sg *sgp = op == KVS_STORE_OP_GET || op == KVS_STORE_OP_PUT ? &sg : NULL;
    uint64_t ticket = 0, failed = 0;
    uint64_t t0 = bench_now_ns();
    kvs_status rc = S->submit(st->s, op, &b->keys, sgp, 0, &ticket);
    if (rc == KVS_OK) rc = S->wait(st->s, ticket, UINT64_MAX, b->results, b->pages, &failed);
    uint64_t ns = bench_now_ns() - t0;
    if (rc != KVS_OK) die(what, S->last_error(st->s));
    for (uint64_t i = 0; i < b->pages; i++) {
        const kvs_store_result *r = &b->results[i];
        int bad = r->status != KVS_OK ||
                  (op == KVS_STORE_OP_PUT && (r->flags & KVS_STORE_SKIPPED)) ||
                  (op == KVS_STORE_OP_GET && r->bytes != b->page);
        if (bad) {
            fprintf(stderr, "kvs-bench-store: %s: key %llu: %s (%d), flags %u, %llu bytes\n", what,
                    (unsigned long long)i, kvs_strerror(r->status), (int)r->status, r->flags,
                    (unsigned long long)r->bytes);
            exit(1);
        }
    }
    return ns;
}

/* Every byte of the get buffers equals the put buffers (the get buffers cleared before the get). */
static void check_get(const batch *b, const char *what) {
    for (uint64_t i = 0; i < b->pages; i++)
        if (memcmp(b->dst + i * b->page, b->src + i * b->page, b->page) != 0) {
            fprintf(stderr, "kvs-bench-store: %s: page %llu differs from what was put\n", what,
                    (unsigned long long)i);
            exit(1);
        }
}

/* --- the memcpy references -------------------------------------------------------------------- */

typedef struct copy_job {
    const batch *b;
    uint32_t first, step;
    int streaming;
} copy_job;

static void *copy_part(void *arg) {
    const copy_job *j = arg;
    for (uint64_t i = j->first; i < j->b->pages; i += j->step) {
        uint8_t *dst = j->b->dst + i * j->b->page;
        const uint8_t *src = j->b->src + i * j->b->page;
        if (j->streaming)
            kvs_copy_streaming(dst, src, j->b->page);
        else
            memcpy(dst, src, j->b->page);
    }
    if (j->streaming) kvs_copy_fence();
    return NULL;
}

/* Copy every page src -> dst with T threads (the caller and T - 1 started ones), with memcpy or
 * with non-temporal stores; the wall time. */
static uint64_t copy_round(const batch *b, uint32_t T, int streaming) {
    copy_job jobs[KVS_STORE_MAX_THREADS] = {{0}};
    if (T < 1) T = 1;
    pthread_t th[KVS_STORE_MAX_THREADS];
    for (uint32_t i = 0; i < T; i++) jobs[i] = (copy_job){b, i, T, streaming};
    uint64_t t0 = bench_now_ns();
    for (uint32_t i = 1; i < T; i++)
        if (pthread_create(&th[i], NULL, copy_part, &jobs[i]) != 0)
            die("memcpy reference", "cannot start a thread");
    copy_part(&jobs[0]);
    for (uint32_t i = 1; i < T; i++) pthread_join(th[i], NULL);
    __asm__ __volatile__("" ::: "memory");
    return bench_now_ns() - t0;
}

/* The figure and its ratio against a reference, from per-round rates (higher is better). */
typedef struct figure {
    double med, ref_med, ratio, ratio_min, ratio_max;
} figure;

static figure against(const double *v, const double *ref, uint32_t n) {
    double *r = malloc(n * sizeof *r);
    if (!r) die("figures", "out of memory");
    for (uint32_t i = 0; i < n; i++) r[i] = v[i] / ref[i];
    figure f = {bench_median(v, n), bench_median(ref, n), bench_median(r, n), bench_min(r, n),
                bench_max(r, n)};
    free(r);
    return f;
}

/* --- 1. dram ---------------------------------------------------------------------------------- */

/* The copies that stand for the limit: memcpy and non-temporal stores (the store copies with
 * those), each by one thread and by as many as the store runs. */
#define COPY_KINDS 4

static void copy_name(int k, uint32_t threads, char *out, size_t len) {
    const char *base = k < 2 ? "memcpy" : "nt_copy";
    if (k % 2)
        snprintf(out, len, "%s_%uthreads", base, threads);
    else
        snprintf(out, len, "%s", base);
}

static uint64_t copy_kind(const batch *b, int k, uint32_t threads) {
    return copy_round(b, k % 2 ? threads : 1, k >= 2);
}

static void print_dram(const char *op, const options *o, const batch *b, const double *v,
                       double *const ref[COPY_KINDS]) {
    int best = 0;
    double med[COPY_KINDS];
    for (int k = 0; k < COPY_KINDS; k++) {
        med[k] = bench_median(ref[k], o->rounds);
        if (med[k] > med[best]) best = k;
    }
    figure f = against(v, ref[best], o->rounds);
    char name[COPY_KINDS][40];
    for (int k = 0; k < COPY_KINDS; k++) copy_name(k, o->threads, name[k], sizeof name[k]);
    printf("{\"bench\":\"store_%s\",\"tier\":\"dram\",\"page_bytes\":%llu,\"pages\":%llu,"
           "\"gbps\":%.3f,\"ref\":\"%s\",\"ref_gbps\":%.3f,\"ratio\":%.3f,\"rounds\":%u,"
           "\"ratio_min\":%.3f,\"ratio_max\":%.3f",
           op, (unsigned long long)b->page, (unsigned long long)b->pages, f.med / 1e9, name[best],
           f.ref_med / 1e9, f.ratio, o->rounds, f.ratio_min, f.ratio_max);
    for (int k = 0; k < COPY_KINDS; k++) printf(",\"%s_gbps\":%.3f", name[k], med[k] / 1e9);
    printf(",\"store_threads\":%u}\n", o->threads);
    printf("store %s, dram, %u x %llu MiB: %.2f GB/s, %s %.2f GB/s, ratio %.3f (%.3f to %.3f);", op,
           o->pages, (unsigned long long)(b->page / MIB), f.med / 1e9, name[best], f.ref_med / 1e9,
           f.ratio, f.ratio_min, f.ratio_max);
    for (int k = 0; k < COPY_KINDS; k++) printf(" %s %.2f", name[k], med[k] / 1e9);
    printf(" GB/s\n");
}

/* --- 3. exists -------------------------------------------------------------------------------- */

static volatile uint64_t sink;

/* The namespace's 16 bytes as the store derives them (a stand-in of equal length: the reference
 * needs the work, not the value). */
static void namespace_hash(uint8_t out[16]) {
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits(NAMESPACE, strlen(NAMESPACE)));
    memcpy(out, c.digest, 16);
}

static uint64_t hash_streamed(const batch *b, const uint8_t ns[16], uint8_t *out) {
    uint64_t t0 = bench_now_ns();
    for (uint32_t rep = 0; rep < EXISTS_REPS; rep++)
        for (uint64_t i = 0; i < b->pages; i++) {
            XXH3_state_t st;
            XXH3_128bits_reset(&st);
            XXH3_128bits_update(&st, ns, 16);
            XXH3_128bits_update(&st, b->key_text + b->offsets[i],
                                b->offsets[i + 1] - b->offsets[i]);
            XXH128_canonical_t c;
            XXH128_canonicalFromHash(&c, XXH3_128bits_digest(&st));
            memcpy(out + i * 16, c.digest, 16);
        }
    __asm__ __volatile__("" ::: "memory");
    return bench_now_ns() - t0;
}

static uint64_t hash_one_call(const batch *b, const uint8_t ns[16], uint8_t *out) {
    uint8_t buf[16 + KVS_STORE_KEY_MAX];
    memcpy(buf, ns, 16);
    uint64_t t0 = bench_now_ns();
    for (uint32_t rep = 0; rep < EXISTS_REPS; rep++)
        for (uint64_t i = 0; i < b->pages; i++) {
            uint64_t len = b->offsets[i + 1] - b->offsets[i];
            memcpy(buf + 16, b->key_text + b->offsets[i], len);
            XXH128_canonical_t c;
            XXH128_canonicalFromHash(&c, XXH3_128bits(buf, 16 + len));
            memcpy(out + i * 16, c.digest, 16);
        }
    __asm__ __volatile__("" ::: "memory");
    return bench_now_ns() - t0;
}

static uint64_t exists_round(store *st, const batch *b, uint8_t *states) {
    uint64_t lead = 0, t0 = bench_now_ns();
    for (uint32_t rep = 0; rep < EXISTS_REPS; rep++) {
        kvs_status rc = S->exists(st->s, &b->keys, 0, 0, states, &lead);
        if (rc != KVS_OK || lead != b->pages) {
            fprintf(stderr, "kvs-bench-store: exists: %s, leading run %llu of %llu\n",
                    kvs_strerror(rc), (unsigned long long)lead, (unsigned long long)b->pages);
            exit(1);
        }
    }
    return bench_now_ns() - t0;
}

static void bench_exists(store *st, const batch *b, const options *o) {
    uint8_t ns[16], *states = malloc(b->pages), *out = malloc(b->pages * 16);
    double *store_ns = calloc(o->rounds, sizeof(double)),
           *streamed = calloc(o->rounds, sizeof(double)), *one = calloc(o->rounds, sizeof(double));
    if (!states || !out || !store_ns || !streamed || !one) die("exists", "out of memory");
    namespace_hash(ns);
    exists_round(st, b, states); /* warm-up */
    hash_streamed(b, ns, out);
    hash_one_call(b, ns, out);
    for (uint32_t r = 0; r < o->rounds; r++) {
        streamed[r] = (double)hash_streamed(b, ns, out) / EXISTS_REPS;
        sink ^= out[0];
        one[r] = (double)hash_one_call(b, ns, out) / EXISTS_REPS;
        sink ^= out[0];
        store_ns[r] = (double)exists_round(st, b, states) / EXISTS_REPS;
    }
    /* lower is better here: the reference is the faster hashing, the ratio store / hash */
    int one_better = bench_median(one, o->rounds) < bench_median(streamed, o->rounds);
    const double *ref = one_better ? one : streamed;
    double *ratio = malloc(o->rounds * sizeof *ratio);
    if (!ratio) die("exists", "out of memory");
    for (uint32_t r = 0; r < o->rounds; r++) ratio[r] = store_ns[r] / ref[r];
    double med = bench_median(store_ns, o->rounds), ref_med = bench_median(ref, o->rounds);
    double n = (double)b->pages;
    printf("{\"bench\":\"store_exists\",\"tier\":\"dram\",\"keys\":%llu,\"key_bytes\":%u,"
           "\"ns_per_call\":%.0f,\"ref\":\"xxh3\",\"ref_variant\":\"%s\",\"ref_ns_per_call\":%.0f,"
           "\"ratio\":%.3f,\"rounds\":%u,\"ratio_min\":%.3f,\"ratio_max\":%.3f,"
           "\"ns_per_key\":%.1f,\"ref_ns_per_key\":%.1f,\"xxh3_streamed_ns_per_call\":%.0f,"
           "\"xxh3_one_call_ns_per_call\":%.0f}\n",
           (unsigned long long)b->pages, KEY_BYTES, med, one_better ? "one call" : "streamed",
           ref_med, bench_median(ratio, o->rounds), o->rounds, bench_min(ratio, o->rounds),
           bench_max(ratio, o->rounds), med / n, ref_med / n, bench_median(streamed, o->rounds),
           bench_median(one, o->rounds));
    printf("store exists, dram, %llu keys of %u bytes (all present): %.0f ns per call (%.1f per "
           "key), XXH3-128 of the keys %.0f ns (%s; streamed %.0f, one call %.0f), ratio %.3f\n",
           (unsigned long long)b->pages, KEY_BYTES, med, med / n, ref_med,
           one_better ? "one call" : "streamed", bench_median(streamed, o->rounds),
           bench_median(one, o->rounds), bench_median(ratio, o->rounds));
    free(states);
    free(out);
    free(store_ns);
    free(streamed);
    free(one);
    free(ratio);
}

static void bench_dram(const options *o, uint64_t page, int with_exists) {
    batch b;
    batch_init(&b, page, o->pages);
    /* room for every page in its slab (max_value_bytes + the header page), and one more */
    char yaml[256];
    snprintf(yaml, sizeof yaml, "tiers:\n  - name: dram\n    type: dram\n    capacity: %llu\n",
             (unsigned long long)((o->pages + 1ull) * (page + OBJECT_HEAD)));
    store st = {0};
    store_open(&st, yaml, &b, o->threads);

    /* round 0, untimed: put, clear the get buffers, get, check every byte */
    run_batch(&st, &b, KVS_STORE_OP_PUT, "dram put");
    memset(b.dst, 0, page * o->pages);
    run_batch(&st, &b, KVS_STORE_OP_GET, "dram get");
    check_get(&b, "dram get");
    for (int k = 0; k < COPY_KINDS; k++) copy_kind(&b, k, o->threads);

    double *all = calloc((2 + COPY_KINDS) * (size_t)o->rounds, sizeof *all);
    if (!all) die("dram", "out of memory");
    double *put = all, *get = all + o->rounds, *ref[COPY_KINDS];
    for (int k = 0; k < COPY_KINDS; k++) ref[k] = all + (2 + k) * (size_t)o->rounds;
    double bytes = (double)page * o->pages;
    for (uint32_t r = 0; r < o->rounds; r++) {
        for (int k = 0; k < COPY_KINDS; k++)
            ref[k][r] = bytes / ((double)copy_kind(&b, k, o->threads) / 1e9);
        run_batch(&st, &b, KVS_STORE_OP_REMOVE, "dram remove"); /* untimed: the put must store */
        put[r] = bytes / ((double)run_batch(&st, &b, KVS_STORE_OP_PUT, "dram put") / 1e9);
        get[r] = bytes / ((double)run_batch(&st, &b, KVS_STORE_OP_GET, "dram get") / 1e9);
    }
    print_dram("put", o, &b, put, ref);
    print_dram("get", o, &b, get, ref);
    if (with_exists) bench_exists(&st, &b, o);
    free(all);
    store_close(&st, 1);
    batch_free(&b);
}

/* --- 2. ssd ----------------------------------------------------------------------------------- */

static char run_root[400];

/* tmpfs and ramfs take O_DIRECT on recent kernels, but their files are memory: no device read. */
static int on_memory_fs(const char *dir) {
    struct statfs f;
    return statfs(dir, &f) == 0 && (f.f_type == 0x01021994 /* TMPFS_MAGIC */ ||
                                    f.f_type == (__typeof__(f.f_type))0x858458f6 /* RAMFS */);
}

/* fio reading `file`: bytes/s, or 0 when fio fails. */
static double fio_read(const char *file, const char *rw, uint64_t bs, uint32_t iodepth,
                       uint64_t bytes) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "fio --output-format=json --ioengine=io_uring --direct=1 --fixedbufs=1 --rw=%s "
             "--bs=%llu --iodepth=%u --io_size=%llu --norandommap --randrepeat=0 "
             "--name=store --filename=%s 2>&1",
             rw, (unsigned long long)bs, iodepth, (unsigned long long)bytes, file);
    FILE *f = popen(cmd, "r");
    if (!f) return 0.0;
    static char out[1 << 20];
    size_t got = fread(out, 1, sizeof out - 1, f);
    out[got] = '\0';
    int rc = pclose(f);
    const char *part = strstr(out, "\"read\" : {");
    const char *bw = part ? strstr(part, "\"bw_bytes\"") : NULL;
    const char *colon = bw ? strchr(bw, ':') : NULL;
    if (rc != 0 || !colon) {
        fprintf(stderr, "fio failed (%d): %.400s\n", rc, out);
        return 0.0;
    }
    return strtod(colon + 1, NULL);
}

/* The tier's own counters, through the store's internals (the store API reports no I/O): they show
 * that the gets came off the device and how many unit reads went through a bounce buffer. */
static kvs_ssd_stats_t ssd_stats(const store *st) {
    kvs_ssd_stats_t s;
    memset(&s, 0, sizeof s);
    kvs_ssd_stats(kvs_tiers_state(st->s->chain, 0), &s);
    return s;
}

#define FIO_KINDS 4

static void bench_ssd(const options *o, uint64_t page) {
    batch b;
    batch_init(&b, page, o->pages);
    char dir[512], file[600];
    snprintf(dir, sizeof dir, "%s/ssd-%llumib", run_root, (unsigned long long)(page / MIB));
    if (mkdir(dir, 0700) != 0) die(dir, strerror(errno));
    snprintf(file, sizeof file, "%s/kvstrata-ssd.data", dir);
    /* One path: its superblock and a slot (header block + stripe) for every unit of every page,
     * one page's units to spare. The stripe holds one whole object (docs/store.md: a value and its
     * 4 KiB header in one unit, one read each). The write buffer takes a whole batch (the default,
     * 64 MiB, turns a batch of puts beyond it away). */
    uint64_t object = page + OBJECT_HEAD;
    uint64_t stripe = (object + 4095) / 4096 * 4096;
    uint64_t units = (object + stripe - 1) / stripe;
    uint64_t capacity = 4096 + (o->pages + 1ull) * units * (4096 + stripe);
    char yaml[1024];
    snprintf(yaml, sizeof yaml,
             "tiers:\n  - name: ssd\n    type: ssd\n    capacity: %llu\n    paths: [%s]\n"
             "    options:\n      write_buffer_bytes: %llu\n      stripe_bytes: %llu\n",
             (unsigned long long)capacity, dir, (unsigned long long)(object * (o->pages + 1ull)),
             (unsigned long long)stripe);
    store st = {0};
    store_open(&st, yaml, &b, o->threads);
    double put_s = (double)run_batch(&st, &b, KVS_STORE_OP_PUT, "ssd put") / 1e9;
    store_close(&st, 0); /* waits for the writes; nothing of the objects stays in the process */
    store_open(&st, yaml, &b, o->threads);

    /* round 0, untimed: every byte comes back from the device */
    memset(b.dst, 0, page * o->pages);
    kvs_ssd_stats_t s0 = ssd_stats(&st);
    run_batch(&st, &b, KVS_STORE_OP_GET, "ssd get");
    check_get(&b, "ssd get");
    kvs_ssd_stats_t s1 = ssd_stats(&st);
    if (s1.recovered != o->pages || s1.read_bytes - s0.read_bytes < page * o->pages)
        die("ssd get", "the objects did not come from the device");

    /* the references: fio reading the tier's data file */
    /* page-sized and stripe-sized reads, each at the depth of one read a store thread and at the
     * most the store keeps in flight (each thread reads up to st.s->read_depth keys together); the
     * fastest is the reference */
    static const char *const kind_name[FIO_KINDS] = {
        "read, page-sized", "randread, page-sized", "read, stripe-sized", "randread, stripe-sized"};
    const uint64_t kind_bs[FIO_KINDS] = {page, page, stripe, stripe};
    uint32_t deep = o->threads * st.s->read_depth * (uint32_t)units;
    const uint32_t kind_depth[FIO_KINDS] = {o->threads, deep, o->threads * (uint32_t)units, deep};
    double *all = calloc((size_t)(FIO_KINDS + 1) * o->rounds, sizeof *all);
    if (!all) die("ssd", "out of memory");
    double *get = all, bytes = (double)page * o->pages;
    s0 = ssd_stats(&st);
    for (uint32_t r = 0; r < o->rounds; r++) {
        get[r] = bytes / ((double)run_batch(&st, &b, KVS_STORE_OP_GET, "ssd get") / 1e9);
        for (int k = 0; k < FIO_KINDS; k++) {
            double *v = all + (size_t)(k + 1) * o->rounds;
            v[r] = fio_read(file, k % 2 ? "randread" : "read", kind_bs[k], kind_depth[k],
                            page * o->pages);
            if (v[r] <= 0.0) die("fio", "the reference run failed");
        }
    }
    s1 = ssd_stats(&st);
    int best = 0;
    double fio_med[FIO_KINDS];
    for (int k = 0; k < FIO_KINDS; k++) {
        fio_med[k] = bench_median(all + (size_t)(k + 1) * o->rounds, o->rounds);
        if (fio_med[k] > fio_med[best]) best = k;
    }
    figure f = against(get, all + (size_t)(best + 1) * o->rounds, o->rounds);
    double reads = (double)(s1.reads - s0.reads) / o->rounds / o->pages;
    double bounce = (double)(s1.bounce_reads - s0.bounce_reads) / o->rounds / o->pages;
    printf("{\"bench\":\"store_get\",\"tier\":\"ssd\",\"page_bytes\":%llu,\"pages\":%llu,"
           "\"gbps\":%.3f,\"ref\":\"fio\",\"ref_variant\":\"%s\",\"ref_bs\":%llu,"
           "\"ref_iodepth\":%u,\"ref_gbps\":%.3f,\"ratio\":%.3f,\"rounds\":%u,"
           "\"ratio_min\":%.3f,\"ratio_max\":%.3f,\"fio_read_page_gbps\":%.3f,"
           "\"fio_randread_page_gbps\":%.3f,\"fio_read_stripe_gbps\":%.3f,"
           "\"fio_randread_stripe_gbps\":%.3f,\"stripe_bytes\":%llu,\"units_per_page\":%llu,"
           "\"unit_reads_per_page\":%.2f,\"bounce_reads_per_page\":%.2f,\"store_threads\":%u,"
           "\"put_gbps\":%.3f}\n",
           (unsigned long long)page, (unsigned long long)b.pages, f.med / 1e9, kind_name[best],
           (unsigned long long)kind_bs[best], kind_depth[best], f.ref_med / 1e9, f.ratio, o->rounds,
           f.ratio_min, f.ratio_max, fio_med[0] / 1e9, fio_med[1] / 1e9, fio_med[2] / 1e9,
           fio_med[3] / 1e9, (unsigned long long)stripe, (unsigned long long)units, reads, bounce,
           o->threads, bytes / put_s / 1e9);
    printf("store get, ssd, %u x %llu MiB: %.2f GB/s, fio %.2f GB/s (%s, bs %llu KiB, depth %u), "
           "ratio %.3f (%.3f to %.3f); %.2f unit reads per page, %.2f through a bounce buffer\n",
           o->pages, (unsigned long long)(page / MIB), f.med / 1e9, f.ref_med / 1e9,
           kind_name[best], (unsigned long long)(kind_bs[best] / 1024), kind_depth[best], f.ratio,
           f.ratio_min, f.ratio_max, reads, bounce);
    free(all);
    store_close(&st, 1);
    unlink(file);
    rmdir(dir);
    batch_free(&b);
}

int main(int argc, char **argv) {
    options o = parse_options(argc, argv);
    const kvs_api *api = kvs_get_api(KVS_ABI_MAJOR);
    S = api && api->struct_size > offsetof(kvs_api, store_api) ? api->store_api(KVS_STORE_ABI_MAJOR)
                                                               : NULL;
    if (!S) die("kvs_get_api", "no store API in this library");
    const char *skip = NULL;
    if (!o.ssd)
        skip = "not asked for (--only dram)";
    else if (!bench_have_fio())
        skip = "fio is not installed (scripts/install-deps.sh installs it)";
    snprintf(run_root, sizeof run_root, "%s/kvs-bench-store-XXXXXX", o.dir);
    if (!skip && !mkdtemp(run_root)) die(o.dir, strerror(errno));
    if (!skip && (on_memory_fs(run_root) || !bench_direct_io_works(run_root))) {
        skip = "--dir is memory (tmpfs) or does not take O_DIRECT; use --dir on a disk";
        rmdir(run_root);
    }
    printf("# kvs-bench-store: %u pages a batch, %u store threads, %u rounds, ssd tier under %s\n",
           o.pages, o.threads, o.rounds, skip ? "(skipped)" : run_root);
    for (uint32_t i = 0; o.dram && i < o.n_sizes; i++) bench_dram(&o, o.sizes[i], i == 0);
    if (skip && !o.ssd) return 0;
    if (skip) {
        fprintf(stderr, "kvs-bench-store: the ssd tier: %s; skipped\n", skip);
        return 77;
    }
    for (uint32_t i = 0; i < o.n_sizes; i++) bench_ssd(&o, o.sizes[i]);
    rmdir(run_root);
    return 0;
}
