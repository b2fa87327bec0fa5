/* store_example.c - kvs-store-example: the smallest complete program over the store API
 * (<kvstrata/kvstrata_store.h>). It opens a store, registers its host buffer, puts 4 pages as one
 * batch (each page two pieces, its K half and its V half), asks which are stored, gets them back
 * into other pages, checks every byte and prints the store's counters. Usage:
 *     kvs-store-example [config.yaml]      (no config: one 1 GiB DRAM tier)
 * Exit status 0 only when every page came back byte for byte. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <kvstrata/kvstrata_store.h>

#define PROG "kvs-store-example"

enum { PAGES = 4, HALF = 2048, PAGE_BYTES = 2 * HALF };

/* The engine's host memory: the pages it puts, then the pages it gets them back into. */
static uint8_t pool[2 * PAGES * PAGE_BYTES];
#define SRC(p) (pool + (size_t)(p)*PAGE_BYTES)
#define DST(p) (pool + (size_t)(PAGES + (p)) * PAGE_BYTES)

static const kvs_store_api *sapi;
static kvs_store *store;

/* Report a failed call with the store's sentence; returns 1, the exit status. */
static int failed(const char *call, kvs_status st) {
    fprintf(stderr, PROG ": %s failed (status %d): %s\n", call, (int)st,
            store ? sapi->last_error(store) : "");
    return 1;
}
#define CHECK(call, name)                              \
    do {                                               \
        kvs_status st_ = (call);                       \
        if (st_ != KVS_OK) return failed((name), st_); \
    } while (0)

/* The PAGES pages from `pages` on, each as two pieces (its K half, its V half): page p's value is
 * iov[seg[p] .. seg[p + 1]) = iov[2p], iov[2p + 1]. */
static void page_iovs(uint8_t *pages, kvs_store_iov *iov, uint64_t *seg) {
    seg[0] = 0;
    for (int p = 0; p < PAGES; p++) {
        uint8_t *page = pages + (size_t)p * PAGE_BYTES;
        iov[2 * p] = (kvs_store_iov){.base = page, .len = HALF};
        iov[2 * p + 1] = (kvs_store_iov){.base = page + HALF, .len = HALF};
        seg[p + 1] = 2 * (uint64_t)(p + 1);
    }
}

/* Submit one batch and wait for it; every key must succeed. */
static int run_batch(uint32_t op, const kvs_store_keys *keys, const kvs_store_sg *sg,
                     const char *what) {
    uint64_t ticket = 0, n_failed = 0;
    kvs_store_result res[PAGES];
    CHECK(sapi->submit(store, op, keys, sg, 0, &ticket), "submit");
    CHECK(sapi->wait(store, ticket, UINT64_MAX, res, PAGES, &n_failed), "wait");
    for (int i = 0; i < PAGES; i++)
        if (res[i].status != KVS_OK) {
            fprintf(stderr, PROG ": %s of page %d failed (status %d)\n", what, i, res[i].status);
            return 1;
        }
    printf(PROG ": %s: %d pages in one batch (ticket %llu), tier %u\n", what, PAGES,
           (unsigned long long)ticket, res[0].tier);
    return 0;
}

int main(int argc, char **argv) {
    if (argc > 2 || (argc == 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")))) {
        FILE *f = argc > 2 ? stderr : stdout;
        fprintf(f, "usage: " PROG " [CONFIG.yaml]\n"
                   "  puts 4 pages through the store API, gets them back and checks every byte;\n"
                   "  without CONFIG.yaml the store has one 1 GiB DRAM tier\n");
        return argc > 2 ? 2 : 0;
    }
    const kvs_api *api = kvs_get_api(KVS_ABI_MAJOR);
    if (!api || api->struct_size < offsetof(kvs_api, store_api) + sizeof api->store_api ||
        !(sapi = api->store_api(KVS_STORE_ABI_MAJOR))) {
        fprintf(stderr, PROG ": this libkvstrata has no store API of major %d\n",
                KVS_STORE_ABI_MAJOR);
        return 1;
    }

    /* 1. Open: the namespace names the model and page layout, the tenant whose values these are. */
    static const char ns[] = "kvs-store-example: tiny model, fp16, 4 KiB pages";
    kvs_store_open_params params = {.struct_size = sizeof params,
                                    .config_path = argc > 1 ? argv[1] : NULL,
                                    .namespace_bytes = ns,
                                    .namespace_len = sizeof ns - 1,
                                    .tenant = "example",
                                    .max_value_bytes = PAGE_BYTES};
    char err[512] = "";
    kvs_status st = sapi->open(&params, &store, err, sizeof err);
    if (st != KVS_OK) {
        fprintf(stderr, PROG ": open failed (status %d): %s\n", (int)st, err);
        return 1;
    }
    printf(PROG ": opened a store on %s\n", argc > 1 ? argv[1] : "one 1 GiB DRAM tier");

    /* 2. Register the buffer every batch below uses. */
    uint64_t region = 0;
    CHECK(sapi->register_memory(store, pool, sizeof pool, KVS_STORE_MEM_HOST, 0, &region),
          "register_memory");
    printf(PROG ": registered %zu bytes of host memory (region %llu)\n", sizeof pool,
           (unsigned long long)region);

    /* 3. The keys: the engine's own bytes, packed back to back with PAGES + 1 offsets. */
    char key_bytes[PAGES * 8];
    uint64_t offsets[PAGES + 1] = {0};
    for (int p = 0; p < PAGES; p++)
        offsets[p + 1] = offsets[p] + (uint64_t)sprintf(key_bytes + offsets[p], "page-%d", p);
    kvs_store_keys keys = {.data = key_bytes, .offsets = offsets, .n = PAGES};

    /* 4. Put: what a forward pass would have written, a function of page and byte. */
    for (int p = 0; p < PAGES; p++)
        for (int i = 0; i < PAGE_BYTES; i++) SRC(p)[i] = (uint8_t)(p * 67 + i * 13 + (i >> 8));
    kvs_store_iov iov[2 * PAGES];
    uint64_t seg[PAGES + 1];
    page_iovs(SRC(0), iov, seg);
    kvs_store_sg sg = {.iov = iov, .seg = seg};
    if (run_batch(KVS_STORE_OP_PUT, &keys, &sg, "put")) return 1;

    /* 5. Exists: how many pages, from the first, are stored. */
    uint64_t n_leading = 0;
    CHECK(sapi->exists(store, &keys, 0, 0, NULL, &n_leading), "exists");
    printf(PROG ": exists: the first %llu of %d pages are stored\n", (unsigned long long)n_leading,
           PAGES);
    if (n_leading != PAGES) return 1;

    /* 6. Get them back into the other pages, and compare byte for byte. */
    page_iovs(DST(0), iov, seg);
    if (run_batch(KVS_STORE_OP_GET, &keys, &sg, "get")) return 1;
    int bad = 0;
    for (int p = 0; p < PAGES; p++) bad += memcmp(SRC(p), DST(p), PAGE_BYTES) != 0;
    printf(PROG ": compare: %d of %d pages byte for byte\n", PAGES - bad, PAGES);

    /* 7. What the store counted. */
    kvs_store_stats stats = {.struct_size = sizeof stats};
    CHECK(sapi->stats(store, &stats), "stats");
    printf(PROG ": stats: %llu puts (%llu stored), %llu gets (%llu hits, %llu bytes), %u tier(s)\n",
           (unsigned long long)stats.puts, (unsigned long long)stats.puts_stored,
           (unsigned long long)stats.gets, (unsigned long long)stats.get_hits,
           (unsigned long long)stats.get_bytes, stats.n_tiers);

    CHECK(sapi->unregister_memory(store, region), "unregister_memory");
    sapi->close(store);
    return bad ? 1 : 0;
}
