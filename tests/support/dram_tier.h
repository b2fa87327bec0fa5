/* dram_tier.h - the dram backend under test, for test_dram and test_dram_shared: the library's
 * built-in table, or with KVS_TEST_DRAM_PLUGIN set (CTest test_dram_plugin, test_dram_shared_plugin)
 * the backend built as its own module (libkvstrata-dram.so), loaded the way a deployment would: a
 * `type: plugin` tier opened by the connector's tier chain, whose table then serves the tests. */
#ifndef KVS_TEST_DRAM_TIER_H
#define KVS_TEST_DRAM_TIER_H

#include <stdint.h>

#include "abi/kvstrata_backend.h"

struct kvs_clock;

/* Set by kvs_test_dram_setup: the table under test and its kvs_dram_set_clock (the module's own in
 * plugin mode). */
extern const kvs_backend_ops *kvs_test_dram_ops;
extern kvs_status (*kvs_test_dram_set_clock)(void *tier, const struct kvs_clock *clock);
/* The sentence the last kvs_test_dram_open wrote when create failed ("" otherwise). */
extern char kvs_test_dram_error[512];

/* Check fixture: load the backend under test (asserting, in plugin mode, that its table lies in the
 * module named by KVS_TEST_DRAM_PLUGIN), and unload it. */
void kvs_test_dram_setup(void);
void kvs_test_dram_teardown(void);

/* create a tier of the backend under test; its error sentence goes to kvs_test_dram_error. */
kvs_status kvs_test_dram_open(const char *name, uint64_t capacity, uint64_t max_object,
                              const kvs_backend_option *opts, uint64_t n_opts,
                              const kvs_backend_host *host, void **state);
/* put object i (len bytes, at most 4KiB, of kvs_test_fill's seed i) under kvs_test_key(i), asserting
 * it is stored. */
/* Get object i (key kvs_test_key(i)) and check it holds len bytes of kvs_test_fill(i). */
void kvs_test_dram_expect(void *state, uint32_t i, uint64_t len);
void kvs_test_dram_put(void *state, uint32_t i, uint64_t len);

#endif
