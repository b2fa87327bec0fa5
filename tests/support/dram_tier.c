/* dram_tier.c - the dram backend under test (contract in dram_tier.h). */
#include "dram_tier.h"

#include <check.h>
#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/dram/dram.h"
#include "connector/config.h"
#include "connector/tiers.h"
#include "objects.h"

const kvs_backend_ops *kvs_test_dram_ops;
kvs_status (*kvs_test_dram_set_clock)(void *tier, const struct kvs_clock *clock);
char kvs_test_dram_error[512];

static kvs_tier_chain *plugin_chain;

static const kvs_backend_ops *ops_from_plugin(const char *path) {
    char yaml[1024], err[512] = "";
    snprintf(
        yaml, sizeof yaml,
        "tiers:\n  - name: dram-plugin\n    type: plugin\n    plugin: %s\n    capacity: 1MiB\n",
        path);
    kvs_config *cfg = NULL;
    ck_assert_msg(kvs_config_parse_string(yaml, strlen(yaml), NULL, &cfg, err, sizeof err) ==
                      KVS_OK,
                  "%s", err);
    ck_assert_msg(kvs_tiers_open(cfg, 4096, NULL, NULL, 0, NULL, NULL, &plugin_chain, err,
                                 sizeof err) == KVS_OK,
                  "%s", err);
    kvs_config_free(cfg);
    const kvs_backend_ops *table = kvs_tiers_ops(plugin_chain, 0);
    /* the table really is the module's, not the library's built-in one */
    Dl_info where;
    char want[PATH_MAX], got[PATH_MAX];
    ck_assert_ptr_ne(table, kvs_dram_backend());
    ck_assert_int_ne(dladdr(table, &where), 0);
    ck_assert_ptr_nonnull(realpath(path, want));
    ck_assert_ptr_nonnull(realpath(where.dli_fname, got));
    ck_assert_str_eq(got, want);
    return table;
}

void kvs_test_dram_setup(void) {
    const char *plugin = getenv("KVS_TEST_DRAM_PLUGIN");
    kvs_test_dram_ops = plugin ? ops_from_plugin(plugin) : kvs_dram_backend();
    kvs_test_dram_set_clock = kvs_dram_set_clock;
    if (plugin) {
        void *module = dlopen(plugin, RTLD_NOW | RTLD_NOLOAD); /* the chain holds it open */
        ck_assert_ptr_nonnull(module);
        *(void **)&kvs_test_dram_set_clock = dlsym(module, "kvs_dram_set_clock");
        ck_assert_ptr_nonnull(kvs_test_dram_set_clock);
        ck_assert_ptr_ne(kvs_test_dram_set_clock, kvs_dram_set_clock);
        ck_assert_int_eq(dlclose(module), 0);
    }
}

void kvs_test_dram_teardown(void) {
    if (plugin_chain) kvs_tiers_close(plugin_chain);
    plugin_chain = NULL;
}

kvs_status kvs_test_dram_open(const char *name, uint64_t capacity, uint64_t max_object,
                              const kvs_backend_option *opts, uint64_t n_opts,
                              const kvs_backend_host *host, void **state) {
    kvs_test_dram_error[0] = '\0';
    kvs_backend_init init = {
        .struct_size = sizeof init,
        .tier_name = name,
        .capacity_bytes = capacity,
        .max_object_bytes = max_object,
        .options = opts,
        .n_options = n_opts,
        .host = host,
        .error = kvs_test_dram_error,
        .error_len = sizeof kvs_test_dram_error,
    };
    return kvs_test_dram_ops->create(&init, state);
}

void kvs_test_dram_expect(void *state, uint32_t i, uint64_t len) {
    uint8_t out[4096];
    uint64_t got = 0;
    kvs_key k = kvs_test_key(i);
    ck_assert_int_eq(kvs_test_dram_ops->get(state, &k, out, sizeof out, &got), KVS_OK);
    ck_assert_uint_eq(got, len);
    ck_assert(kvs_test_bytes_match(out, got, i));
}

void kvs_test_dram_put(void *state, uint32_t i, uint64_t len) {
    uint8_t buf[4096];
    ck_assert_uint_le(len, sizeof buf);
    kvs_test_fill(buf, len, i);
    kvs_key k = kvs_test_key(i);
    ck_assert_int_eq(kvs_test_dram_ops->put(state, &k, buf, len), KVS_OK);
}
