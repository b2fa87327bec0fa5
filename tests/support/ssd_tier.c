/* ssd_tier.c - ssd tiers for the ssd suites (contract in ssd_tier.h). */
#include "ssd_tier.h"

#include <check.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "objects.h"
#include "test_support.h"

/* Log lines the tier wrote, for checks on what it told the operator. */
static pthread_mutex_t log_mutex = PTHREAD_MUTEX_INITIALIZER;
static char log_text[8192];

static void capture_log(void *ctx, int level, const char *message) {
    (void)ctx;
    (void)level;
    pthread_mutex_lock(&log_mutex);
    size_t used = strlen(log_text);
    snprintf(log_text + used, sizeof log_text - used, "%s\n", message);
    pthread_mutex_unlock(&log_mutex);
}

kvs_backend_host kvs_test_ssd_host = {.struct_size = sizeof(kvs_backend_host), .log = capture_log};
char kvs_test_ssd_error[512];

const uint64_t kvs_test_ssd_lengths[KVS_TEST_SSD_N_LENGTHS] = {
    0, 1, 4095, 4096, 5000, 16 * 1024, 16 * 1024 + 1, 40 * 1024 + 123, 64 * 1024};

void kvs_test_ssd_setup(void) {
    pthread_mutex_lock(&log_mutex);
    log_text[0] = '\0';
    pthread_mutex_unlock(&log_mutex);
}

int kvs_test_ssd_log_contains(const char *needle) {
    pthread_mutex_lock(&log_mutex);
    int found = strstr(log_text, needle) != NULL;
    pthread_mutex_unlock(&log_mutex);
    return found;
}

uint8_t *kvs_test_aligned_buffer(uint64_t len) {
    void *p = NULL;
    ck_assert_int_eq(posix_memalign(&p, 4096, len ? len : 4096), 0);
    return p;
}

void kvs_test_ssd_dirs(kvs_test_dirs *d) {
    char root[256];
    ck_assert_int_eq(kvs_test_tmpdir(root, sizeof root), 0);
    memcpy(d->root, root, sizeof root);
    for (int i = 0; i < KVS_TEST_SSD_MAX_PATHS; i++) {
        snprintf(d->dir[i], sizeof d->dir[i], "%s/disk%d", root, i);
        ck_assert_int_eq(mkdir(d->dir[i], 0700), 0);
    }
}

kvs_status kvs_test_ssd_try_open(const kvs_test_dirs *d, const kvs_test_ssd_args *a, void **st) {
    kvs_backend_option opts[KVS_TEST_SSD_MAX_PATHS + 12];
    uint64_t n = 0;
    for (uint32_t i = 0; i < a->n_paths; i++) opts[n++] = (kvs_backend_option){"path", d->dir[i]};
    for (int i = 0; i < 12 && a->options[i][0]; i++)
        opts[n++] = (kvs_backend_option){a->options[i][0], a->options[i][1]};
    kvs_test_ssd_error[0] = '\0';
    kvs_backend_init init = {.struct_size = sizeof init,
                             .tier_name = a->name ? a->name : "ssd0",
                             .capacity_bytes = a->capacity,
                             .max_object_bytes = a->max_object,
                             .options = opts,
                             .n_options = n,
                             .host = a->host ? a->host : &kvs_test_ssd_host,
                             .error = kvs_test_ssd_error,
                             .error_len = sizeof kvs_test_ssd_error,
                             .staging_base = a->staging,
                             .staging_len = a->staging_len};
    *st = NULL;
    return kvs_ssd_backend()->create(&init, st);
}

void *kvs_test_ssd_open(const kvs_test_dirs *d, const kvs_test_ssd_args *a) {
    void *st = NULL;
    kvs_status rc = kvs_test_ssd_try_open(d, a, &st);
    ck_assert_msg(rc == KVS_OK, "create: %s", kvs_test_ssd_error);
    return st;
}

void kvs_test_ssd_put(void *st, uint32_t i, uint64_t len) {
    const kvs_backend_ops *ops = kvs_ssd_backend();
    uint8_t *buf = malloc(len ? len : 1);
    ck_assert_ptr_nonnull(buf);
    kvs_test_fill(buf, len, i);
    kvs_key k = kvs_test_key(i);
    kvs_status rc = ops->put(st, &k, buf, len);
    ck_assert_msg(rc == KVS_OK, "put %u: %s", i, ops->last_error(st));
    free(buf);
}

void kvs_test_ssd_flush(void *st) {
    ck_assert_int_eq(kvs_ssd_flush(st, 20000), KVS_OK);
}

kvs_status kvs_test_ssd_get(void *st, uint32_t i, uint64_t want_len) {
    uint64_t cap = want_len + 8192, len = 0;
    uint8_t *buf = kvs_test_aligned_buffer(cap);
    kvs_key k = kvs_test_key(i);
    kvs_status rc = kvs_ssd_backend()->get(st, &k, buf, cap, &len);
    if (rc == KVS_OK) {
        ck_assert_uint_eq(len, want_len);
        ck_assert_msg(kvs_test_bytes_match(buf, len, i), "object %u came back with other bytes", i);
    }
    free(buf);
    return rc;
}

uint64_t kvs_test_ssd_present(void *st, uint32_t i) {
    kvs_key k = kvs_test_key(i);
    uint64_t n = 0;
    ck_assert_int_eq(kvs_ssd_backend()->contains(st, &k, 1, &n), KVS_OK);
    return n;
}

kvs_ssd_stats_t kvs_test_ssd_stats(void *st) {
    kvs_ssd_stats_t s;
    ck_assert_int_eq(kvs_ssd_stats(st, &s), KVS_OK);
    return s;
}
