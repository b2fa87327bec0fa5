/* remote_tier.c - see remote_tier.h. */
#include "remote_tier.h"

#include <check.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "backends/ucx/auth.h"
#include "backends/ucx/remote.h"
#include "test_support.h"

static void write_key(const char *path, uint8_t seed) {
    uint8_t psk[32];
    for (size_t i = 0; i < sizeof psk; i++) psk[i] = (uint8_t)(i * 7 + seed);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, psk, sizeof psk), (ssize_t)sizeof psk);
    ck_assert_int_eq(close(fd), 0);
}

/* dir/master.key beside a tenant's key file at key_path: the key the node derives tenants' from. */
static void master_of(const char *key_path, char *out, size_t len) {
    const char *slash = strrchr(key_path, '/');
    int dir_len = slash ? (int)(slash - key_path) : 1;
    snprintf(out, len, "%.*s/master.key", dir_len, slash ? key_path : ".");
}

void kvs_test_remote_tenant_key(const char *key_path, const char *tenant, char *out, size_t len) {
    char master_path[700], err[256];
    master_of(key_path, master_path, sizeof master_path);
    const char *slash = strrchr(master_path, '/');
    snprintf(out, len, "%.*s/%s.key", (int)(slash - master_path), master_path, tenant);
    kvs_remote_psk master, key;
    ck_assert_msg(kvs_remote_psk_load(master_path, &master, err, sizeof err) == KVS_OK, "%s", err);
    ck_assert_int_eq(kvs_remote_tenant_psk(&master, tenant, strlen(tenant), &key), KVS_OK);
    int fd = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, key.bytes, key.len), (ssize_t)key.len);
    ck_assert_int_eq(close(fd), 0);
    kvs_remote_psk_clear(&master);
    kvs_remote_psk_clear(&key);
}

void kvs_test_remote_keys(char *dir, size_t dir_len, char *key_path, size_t key_len,
                          char *wrong_path, size_t wrong_len) {
    ck_assert_int_eq(kvs_test_tmpdir(dir, dir_len), 0);
    char master[700];
    snprintf(master, sizeof master, "%s/master.key", dir);
    snprintf(wrong_path, wrong_len, "%s/wrong.key", dir);
    write_key(master, 3);
    write_key(wrong_path, 4);
    snprintf(key_path, key_len, "%s/x.key", dir); /* only its folder counts */
    kvs_test_remote_tenant_key(key_path, "test-tenant", key_path, key_len);
}

void kvs_test_remote_node_start(kvs_test_node *d, const char *key_path) {
    kvs_test_remote_node_start_with(d, key_path, KVS_TEST_REMOTE_NODE_YAML);
}

void kvs_test_remote_node_start_with(kvs_test_node *d, const char *key_path, const char *yaml) {
    kvs_test_remote_node_start_flag(d, key_path, yaml, NULL, NULL);
}

void kvs_test_remote_node_start_flag(kvs_test_node *d, const char *key_path, const char *yaml,
                                     const char *flag, const char *value) {
    kvs_test_node_prepare(d, yaml);
    char psk[700], f[64] = "", v[64] = "";
    master_of(key_path, psk, sizeof psk);
    if (flag) snprintf(f, sizeof f, "%s", flag);
    if (value) snprintf(v, sizeof v, "%s", value);
    char *const argv[] = {
        "kvstrata-node", "--config",           d->config_path, "--psk-file",    psk, "--listen",
        "127.0.0.1:0",   "--max-object-bytes", "2MiB",         flag ? f : NULL, v,   NULL};
    kvs_test_node_start(d, argv);
}

kvs_status kvs_test_remote_create(const kvs_backend_option *opts, uint64_t n, char *err,
                                  size_t err_len, void **state, void *staging,
                                  uint64_t staging_len) {
    kvs_backend_init init;
    memset(&init, 0, sizeof init);
    init.struct_size = sizeof init;
    init.tier_name = "far";
    init.max_object_bytes = 2u * 1024u * 1024u;
    init.options = opts;
    init.n_options = n;
    init.error = err;
    init.error_len = err_len;
    init.staging_base = staging;
    init.staging_len = staging_len;
    err[0] = '\0';
    return kvs_remote_backend()->create(&init, state);
}

kvs_key kvs_test_remote_key(uint32_t i) {
    kvs_key k;
    for (int b = 0; b < 16; b++) k.bytes[b] = (uint8_t)(i * 31 + (uint32_t)b * 7 + 1);
    return k;
}
