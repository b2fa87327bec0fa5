/* connector_rig.h - a connector handle over host pages that the connector's Check suites drive through
 * the ABI table (test_api, test_scheduler, test_restore, test_worker, test_meta, test_tiers): a
 * two-layer fp16 model in a vLLM FlashAttention (NHD) layout, configs written to a fresh directory, and
 * a manual clock the handle's leases run on. Helpers fail the running Check test on any error. */
#ifndef KVS_TEST_CONNECTOR_RIG_H
#define KVS_TEST_CONNECTOR_RIG_H

#include <stdint.h>

#include "abi/kvstrata.h"
#include "common/clock.h"

#ifndef KVS_TEST_LIB_DIR
#define KVS_TEST_LIB_DIR "build/lib"
#endif

enum { LAYERS = 2, HEADS = 2, HEAD_DIM = 16, BT = 16, CHUNK = 32, BLOCKS = 64 };
#define HEAD_BYTES     (HEAD_DIM * 2)
#define TOKEN_BYTES    (HEADS * HEAD_BYTES)
#define RIG_MAX_LAYERS 8

/* The directory configs are written to (made by rig_setup, removed by rig_teardown). */
extern char rig_tmpdir[512];
/* Registered layers of the rigs a test opens (stage tests add some); rig_setup resets it to LAYERS. */
extern int rig_layers;
/* The transfer_role the rigs a test opens pass (kvs_transfer_role); rig_setup resets it to both. */
extern uint32_t rig_transfer_role;

typedef struct rig {
    kvs_handle *h;
    uint8_t *pages; /* [LAYERS][2][BLOCKS][BT][HEADS][HEAD_BYTES] */
    kvs_layer_view views[RIG_MAX_LAYERS];
    char error[512];
    kvs_clock clock; /* the handle's leases run on it: a test moves it on instead of sleeping */
    int kv_seed; /* mixed into what rig_write_kv writes (0: as always): TP ranks hold other KV */
    int mla;     /* the model is MLA: K pages only, no V */
    int finite; /* rig_write_kv writes finite fp16 values (KV a codec can take), not byte patterns */
} rig;

/* The Check fixture: a fresh rig_tmpdir and rig_layers = LAYERS; teardown removes the directory. */
void rig_setup(void);
void rig_teardown(void);

/* Write `text` to rig_tmpdir/name; returns the path (a static buffer, valid until the next call). */
const char *rig_config(const char *name, const char *text);
/* KVS_TEST_HOST_COPIES=deferred runs a suite with the host device acting like an asynchronous one
 * (copies at wait_layer_load / wait_save, checksums on the hash pool): the CUDA ordering path;
 * KVS_TEST_HOST_COPIES=threads with three threads moving each layer's copies (device.host_threads).
 * This is the `device:` section that asks for it, or "". */
const char *rig_device_section(void);
/* A dram tier of capacity_objects chunk objects with leases of lease_ms, as dram.yaml. */
const char *rig_dram_config(uint64_t capacity_objects, uint64_t lease_ms);
/* A 4MiB dram tier in shared memory named for this process, as shared.yaml: handles of other
 * processes and threads that open it share its chunks. */
const char *rig_shared_config(void);

/* The rig's model: rig_layers layers of HEADS heads of HEAD_DIM fp16, blocks of BT tokens. */
kvs_model_desc rig_model(void);
/* Bytes of one layer's K and V pages. */
uint64_t rig_layer_span(void);

/* Open a handle of `role` on cfg (NULL: the defaults), its leases on the rig's manual clock (started at
 * the monotonic now); a worker also registers the rig's pages. Returns what open or register_kv did. */
kvs_status rig_open(rig *r, kvs_role role, const char *cfg);
/* The same with another model over the rig's pages: its token must be TOKEN_BYTES (HEADS heads of
 * HEAD_DIM fp16, or an MLA latent of HEADS * HEAD_DIM); tensor-parallel tests open one per rank. */
kvs_status rig_open_model(rig *r, kvs_role role, const char *cfg, const kvs_model_desc *model);
void rig_close(rig *r);

/* Address of K (kv=0) or V (kv=1) of token t of a request with block table `blocks`. */
uint8_t *rig_kv_at(rig *r, int layer, int kv, const uint32_t *blocks, uint64_t t);
/* What the engine "computed" for tokens [from, to) in layers [l0, l1): a function of the token's
 * value, position, layer and kv. */
void rig_write_kv_layers(rig *r, const uint32_t *blocks, const int32_t *tokens, uint64_t from,
                         uint64_t to, int l0, int l1);
void rig_write_kv(rig *r, const uint32_t *blocks, const int32_t *tokens, uint64_t from,
                  uint64_t to);
/* 1 if every layer of tokens [from, to) holds what rig_write_kv writes. */
int rig_kv_matches(rig *r, const uint32_t *blocks, const int32_t *tokens, uint64_t from,
                   uint64_t to);
void rig_make_tokens(int32_t *tokens, uint64_t n, int seed);
void rig_blocks_from(uint32_t *blocks, uint64_t n, uint32_t first);

/* The worker half of one step: bind, load, compute [compute_from, compute_to), save, finish. */
void rig_worker_step(rig *r, const void *meta, uint64_t len, const uint32_t *blocks,
                     const int32_t *tokens, uint64_t compute_from, uint64_t compute_to);
/* One whole prefill of a request in one step, on a handle of role both: returns the hit tokens. */
uint64_t rig_prefill(rig *r, const char *id, const int32_t *tokens, uint64_t n,
                     const uint32_t *blocks);
/* Request id's step over 128 tokens t in 8 blocks b (n_computed held, `hit` tokens loaded, the rest
 * computed), with load_dropped asked before start_load (refused) and after it: the positions it
 * names go to dropped[128], their count to *n_dropped. Returns the step's error blocks. */
uint64_t rig_drop_step(rig *r, const char *id, const int32_t *t, const uint32_t *b,
                       uint64_t n_computed, uint64_t hit, uint8_t *dropped, uint64_t *n_dropped);
/* 1 if chunk `chunk` of tokens is stored in some tier of the rig's handle. */
int rig_stored(rig *r, const int32_t *tokens, uint64_t chunk);

#endif
