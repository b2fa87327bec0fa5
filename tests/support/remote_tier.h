/* remote_tier.h - pieces of the remote tier suites (backends/ucx/remote.h): the key files the nodes
 * and the tier read (and a wrong one), a kvstrata-node started as those suites run it, the tier's
 * create with options and staging, and its keys. Failures are Check assertions; one thread. */
#ifndef KVS_TEST_REMOTE_TIER_H
#define KVS_TEST_REMOTE_TIER_H

#include <stddef.h>
#include <stdint.h>

#include "abi/kvstrata_backend.h"
#include "node_proc.h"

#define KVS_TEST_REMOTE_NODE_YAML \
    "version: 1\nlog_level: error\ntiers:\n  - name: dram\n    type: dram\n    capacity: 256MiB\n"

/* Key files in a new directory dir: master.key (the nodes'), key_path (tenant "test-tenant"'s, derived
 * from it: the tier's) and wrong_path (another key); remove dir with kvs_test_rmtree. */
void kvs_test_remote_keys(char *dir, size_t dir_len, char *key_path, size_t key_len,
                          char *wrong_path, size_t wrong_len);
/* The key of `tenant` (from the master.key beside key_path) in a file of that folder; out gets its
 * path (out may be key_path). */
void kvs_test_remote_tenant_key(const char *key_path, const char *tenant, char *out, size_t len);
/* A node on 127.0.0.1 (port chosen by the node) with 256 MiB of DRAM, the master.key beside key_path
 * and objects up to 2 MiB. Stop it with kvs_test_node_stop. */
void kvs_test_remote_node_start(kvs_test_node *d, const char *key_path);
/* The same node with the config yaml_text instead. */
void kvs_test_remote_node_start_with(kvs_test_node *d, const char *key_path, const char *yaml_text);
/* The same with one more flag and its value on the command line (flag NULL: none). */
void kvs_test_remote_node_start_flag(kvs_test_node *d, const char *key_path, const char *yaml_text,
                                     const char *flag, const char *value);
/* The tier "far" (max_object_bytes 2 MiB) created from options, with staging memory (may be NULL);
 * err gets its sentence. */
kvs_status kvs_test_remote_create(const kvs_backend_option *opts, uint64_t n, char *err,
                                  size_t err_len, void **state, void *staging,
                                  uint64_t staging_len);
/* The key of number i. */
kvs_key kvs_test_remote_key(uint32_t i);

#endif
