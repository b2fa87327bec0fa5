/* config_check.c - the configuration checks of config_check.h. */
#include "config_check.h"

#include <check.h>
#include <stdio.h>
#include <string.h>

#include "test_support.h"

char cfg_err[2048];
char cfg_path[1024];
kvs_config cfg_not_set;

kvs_status cfg_load(const char *text, kvs_config **cfg) {
    char dir[512];
    ck_assert_int_eq(kvs_test_tmpdir(dir, sizeof dir), 0);
    ck_assert_int_eq(kvs_test_write_file(dir, "cfg.yaml", text, cfg_path, sizeof cfg_path), 0);
    cfg_err[0] = '\0';
    *cfg = &cfg_not_set;
    kvs_status st = kvs_config_load(cfg_path, cfg, cfg_err, sizeof cfg_err);
    kvs_test_rmtree(dir);
    return st;
}

void cfg_expect_refused(const char *text, kvs_status want, const char *where, const char *what) {
    kvs_config *cfg;
    kvs_status st = cfg_load(text, &cfg);
    ck_assert_msg(st == want, "status %d, want %d (message: %s)", st, want, cfg_err);
    ck_assert_ptr_null(cfg);
    if (where)
        ck_assert_msg(strstr(cfg_err, where) != NULL, "message \"%s\" lacks \"%s\"", cfg_err,
                      where);
    if (what)
        ck_assert_msg(strstr(cfg_err, what) != NULL, "message \"%s\" lacks \"%s\"", cfg_err, what);
}

kvs_config *cfg_load_ok(const char *text) {
    kvs_config *cfg;
    kvs_status st = cfg_load(text, &cfg);
    ck_assert_msg(st == KVS_OK, "status %d: %s", st, cfg_err);
    ck_assert_ptr_nonnull(cfg);
    return cfg;
}

void cfg_expect_open_refused(const char *dir, const char *text, const char *where,
                             const char *what) {
    char path[1024], want[1200];
    ck_assert_int_eq(kvs_test_write_file(dir, "open.yaml", text, path, sizeof path), 0);
    const kvs_api *api = kvs_get_api(KVS_ABI_MAJOR);
    kvs_model_desc m = {.struct_size = sizeof m,
                        .model_id = "m",
                        .dtype = KVS_DTYPE_FP16,
                        .n_layers = 2,
                        .n_kv_heads = 2,
                        .head_dim = 16,
                        .block_tokens = 16,
                        .tp_size = 1,
                        .vocab_size = 100};
    kvs_open_params p = {
        .struct_size = sizeof p, .role = KVS_ROLE_SCHEDULER, .config_path = path, .model = &m};
    kvs_handle *h = NULL;
    cfg_err[0] = '\0';
    kvs_status st = api->open(&p, &h, cfg_err, sizeof cfg_err);
    ck_assert_msg(st == KVS_ECONFIG, "status %d, want KVS_ECONFIG (message: %s)", st, cfg_err);
    ck_assert_ptr_null(h);
    snprintf(want, sizeof want, "%s:%s", path, where);
    ck_assert_msg(strstr(cfg_err, want) != NULL, "message \"%s\" lacks \"%s\"", cfg_err, want);
    ck_assert_msg(strstr(cfg_err, what) != NULL, "message \"%s\" lacks \"%s\"", cfg_err, what);
}
