/* bench_common.h - small helpers shared by the bench/bench_*.c programs: the monotonic clock, medians,
 * a deterministic generator, flag parsing and the failure exit. Header-only (static inline) because each
 * benchmark is its own executable. */
#ifndef KVS_BENCH_COMMON_H
#define KVS_BENCH_COMMON_H

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "abi/kvstrata.h"

static inline uint64_t bench_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline int bench_cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median of v[0..n), v left as it is: the benchmarks print their rounds in round order after the
 * medians and pair each round with its reference's (a sort in place broke both). */
static inline double bench_median(const double *v, size_t n) {
    if (n == 0) return 0.0;
    double *s = (double *)malloc(n * sizeof *s);
    if (!s) {
        fprintf(stderr, "bench: out of memory for a median of %zu values\n", n);
        exit(1);
    }
    memcpy(s, v, n * sizeof *s);
    qsort(s, n, sizeof *s, bench_cmp_double);
    double m = n % 2 ? s[n / 2] : (s[n / 2 - 1] + s[n / 2]) / 2.0;
    free(s);
    return m;
}

/* Smallest and largest of v[0..n) (0 when n is 0). */
static inline double bench_min(const double *v, size_t n) {
    double m = n ? v[0] : 0.0;
    for (size_t i = 1; i < n; i++) m = v[i] < m ? v[i] : m;
    return m;
}

static inline double bench_max(const double *v, size_t n) {
    double m = n ? v[0] : 0.0;
    for (size_t i = 1; i < n; i++) m = v[i] > m ? v[i] : m;
    return m;
}

/* Anonymous memory of bytes, in large pages where the kernel gives them when `huge` (as the
 * connector's pool and the tiers' slabs are), filled with `fill` so no page fault lands inside a
 * measurement. Exits naming `what` when it cannot be mapped. */
static inline uint8_t *bench_map(uint64_t bytes, int huge, int fill, const char *what) {
    void *m = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) {
        fprintf(stderr, "cannot map %llu bytes for %s: %s\n", (unsigned long long)bytes, what,
                strerror(errno));
        exit(1);
    }
    if (huge) madvise(m, bytes, MADV_HUGEPAGE);
    memset(m, fill, bytes);
    return (uint8_t *)m;
}

/* splitmix64: deterministic, so every run measures the same data. */
static inline uint64_t bench_mix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* Parse a flag value as an unsigned integer in [min, max]; exits with a message otherwise. */
static inline uint64_t bench_parse_u64(const char *flag, const char *text, uint64_t min,
                                       uint64_t max) {
    char *end = NULL;
    errno = 0;
    unsigned long long v = text ? strtoull(text, &end, 10) : 0;
    if (!text || errno || end == text || *end != '\0' || text[0] == '-' || v < min || v > max) {
        fprintf(stderr, "%s: expected an integer in [%llu, %llu], got '%s'\n", flag,
                (unsigned long long)min, (unsigned long long)max, text ? text : "(nothing)");
        exit(2);
    }
    return (uint64_t)v;
}

/* A failed kvstrata call: name it, print the handle's last error and exit non-zero. */
static inline void bench_fail(const kvs_api *api, const kvs_handle *h, const char *what,
                              kvs_status st) {
    fprintf(stderr, "%s failed: %s (%d): %s\n", what, api ? api->strerror(st) : kvs_strerror(st),
            (int)st, api && h ? api->last_error(h) : "");
    exit(1);
}

#define BENCH_CHECK(api, h, call)                                          \
    do {                                                                   \
        kvs_status bench_st_ = (call);                                     \
        if (bench_st_ != KVS_OK) bench_fail((api), (h), #call, bench_st_); \
    } while (0)

/* Write text to a new temporary file and return its path in path[0..len); exits on failure. */
static inline void bench_write_temp(const char *text, char *path, size_t len) {
    const char *dir = getenv("TMPDIR");
    snprintf(path, len, "%s/kvs-bench-XXXXXX.yaml", dir && *dir ? dir : "/tmp");
    int fd = mkstemps(path, 5);
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (!f || fputs(text, f) == EOF || fclose(f) != 0) {
        fprintf(stderr, "cannot write the temporary config %s: %s\n", path, strerror(errno));
        exit(1);
    }
}

/* 1 when a file in dir opens with O_DIRECT (a device read, not the page cache). */
static inline int bench_direct_io_works(const char *dir) {
    char file[512];
    snprintf(file, sizeof file, "%s/.kvs-bench-direct-XXXXXX", dir);
    int fd = mkstemp(file);
    if (fd < 0) return 0;
    close(fd);
    fd = open(file, O_RDWR | O_DIRECT);
    unlink(file);
    if (fd < 0) return 0;
    close(fd);
    return 1;
}

/* 1 when fio runs (the SSD benchmarks' reference). */
static inline int bench_have_fio(void) {
    return system("fio --version >/dev/null 2>&1") == 0;
}

#endif
