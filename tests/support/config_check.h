/* config_check.h - loading YAML texts as configuration files in the config suites (test_config*.c) and
 * checking what the loader or an opening connector refuses: status, file:line:column, key, sentence.
 * Helpers fail the running Check test on any error. */
#ifndef KVS_TEST_CONFIG_CHECK_H
#define KVS_TEST_CONFIG_CHECK_H

#include "connector/config.h"

/* One dram tier of 1GiB, to complete a file that tests some other key. */
#define ONE_TIER "tiers:\n  - name: dram\n    type: dram\n    capacity: 1GiB\n"

/* The loader's last message, and the path of the last file cfg_load wrote. */
extern char cfg_err[2048];
extern char cfg_path[1024];
/* Stands in *out before a call, so a left-over pointer is noticed. */
extern kvs_config cfg_not_set;

/* Writes text as cfg.yaml in a fresh directory and loads it; the directory is removed after. */
kvs_status cfg_load(const char *text, kvs_config **cfg);
/* Expects `text` to be refused with `want`, *out NULL, and a message holding `where`
 * (file:line:col: key) and `what` (the explanation); either may be NULL. */
void cfg_expect_refused(const char *text, kvs_status want, const char *where, const char *what);
/* `text` loaded; free it with kvs_config_free. */
kvs_config *cfg_load_ok(const char *text);
/* Opening a connector (scheduler role: the tiers, no staging pool) on `text`, written as open.yaml
 * in dir, must fail with KVS_ECONFIG and a message naming the file at `where` ("L:C: key '...'")
 * and holding `what`. */
void cfg_expect_open_refused(const char *dir, const char *text, const char *where,
                             const char *what);

#endif
