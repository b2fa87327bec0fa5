/* test_abi.c - the ABI contract, executable: the layout of every public struct is pinned, structs of
 * every size an engine may have been built with are accepted or refused as abi/kvstrata.h says, and
 * outbound structs are written no further than the caller's struct_size. The library is loaded with
 * dlopen as an engine would, and only the public headers are included: what a plugin or engine needs
 * lives in abi/. */
#include <check.h>
#include <dlfcn.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "abi/kvstrata.h"
#include "abi/kvstrata_backend.h"
#include "abi/kvstrata_lossy.h"
#include "abi/kvstrata_lsc.h"
#include "abi/kvstrata_plans.h"
#include "abi/kvstrata_sparse.h"
#include "abi/kvstrata_store.h"

/* --- layouts (LP64): appending a field adds a line and changes only its struct's size ------------- */

#define AT(T, field, offset, size)                                                      \
    _Static_assert(offsetof(T, field) == (offset) && sizeof(((T *)0)->field) == (size), \
                   #T "." #field)
#define SIZE(T, size) _Static_assert(sizeof(T) == (size), "sizeof " #T)

_Static_assert(sizeof(kvs_status) == 4, "kvs_status");
AT(kvs_model_desc, struct_size, 0, 4);
AT(kvs_model_desc, model_id, 8, 8);
AT(kvs_model_desc, dtype, 16, 4);
AT(kvs_model_desc, n_layers, 20, 4);
AT(kvs_model_desc, n_kv_heads, 24, 4);
AT(kvs_model_desc, head_dim, 28, 4);
AT(kvs_model_desc, block_tokens, 32, 4);
AT(kvs_model_desc, is_mla, 36, 4);
AT(kvs_model_desc, tp_rank, 40, 4);
AT(kvs_model_desc, tp_size, 44, 4);
AT(kvs_model_desc, salt, 48, 8);
AT(kvs_model_desc, vocab_size, 56, 4);
SIZE(kvs_model_desc, 64);
_Static_assert(KVS_MODEL_DESC_SIZE_1_0 == offsetof(kvs_model_desc, vocab_size), "model 1.0 size");

AT(kvs_open_params, struct_size, 0, 4);
AT(kvs_open_params, role, 4, 4);
AT(kvs_open_params, config_path, 8, 8);
AT(kvs_open_params, model, 16, 8);
AT(kvs_open_params, transfer_role, 24, 4); /* 1.10 */
SIZE(kvs_open_params, 32);
_Static_assert(KVS_TRANSFER_BOTH == 0 && KVS_TRANSFER_PRODUCER == 1 && KVS_TRANSFER_CONSUMER == 2,
               "kvs_transfer_role values");
_Static_assert(KVS_OPEN_PARAMS_SIZE_1_0 == 24, "open params 1.0 size");

AT(kvs_layer_view, struct_size, 0, 4);
AT(kvs_layer_view, device_kind, 4, 4);
AT(kvs_layer_view, device_index, 8, 4);
AT(kvs_layer_view, n_blocks, 12, 4);
AT(kvs_layer_view, k_base, 16, 8);
AT(kvs_layer_view, v_base, 24, 8);
AT(kvs_layer_view, block_stride, 32, 8);
AT(kvs_layer_view, token_stride, 40, 8);
AT(kvs_layer_view, head_stride, 48, 8);
SIZE(kvs_layer_view, 56);
_Static_assert(KVS_LAYER_VIEW_SIZE_1_0 == 56, "layer view 1.0 size");

AT(kvs_lookup_result, struct_size, 0, 4);
AT(kvs_lookup_result, n_hit_tokens, 8, 8);
AT(kvs_lookup_result, unknown_yet, 16, 1);
AT(kvs_lookup_result, load_async, 17, 1);
AT(kvs_lookup_result, n_lossy_tokens, 24, 8);
AT(kvs_lookup_result, chunk_tokens, 32, 4); /* 1.10 */
SIZE(kvs_lookup_result, 40);
_Static_assert(KVS_LOOKUP_RESULT_SIZE_1_0 == 24, "lookup result 1.0 size");

/* frozen for major 1 */
AT(kvs_step_request, req_id, 0, 8);
AT(kvs_step_request, tokens, 8, 8);
AT(kvs_step_request, n_tokens, 16, 8);
AT(kvs_step_request, block_ids, 24, 8);
AT(kvs_step_request, n_block_ids, 32, 8);
AT(kvs_step_request, n_computed, 40, 8);
AT(kvs_step_request, n_scheduled, 48, 8);
SIZE(kvs_step_request, 56);
AT(kvs_event, kind, 0, 1);
AT(kvs_event, key, 1, 16);
AT(kvs_event, tier, 20, 4);
SIZE(kvs_event, 24);

AT(kvs_restore_plan, struct_size, 0, 4);
AT(kvs_restore_plan, mode, 4, 4);
AT(kvs_restore_plan, first_token, 8, 8);
AT(kvs_restore_plan, end_token, 16, 8);
AT(kvs_restore_plan, recompute_tokens, 24, 8);
AT(kvs_restore_plan, predicted_ms, 32, 8);
AT(kvs_restore_plan, recompute_layers, 40, 4);
AT(kvs_restore_plan, reserved, 44, 4);
AT(kvs_restore_plan, n_stages, 48, 4);
AT(kvs_restore_plan, stage_recompute_layers, 52, 4 * KVS_MAX_STAGES);
SIZE(kvs_restore_plan, 88);
_Static_assert(KVS_RESTORE_PLAN_SIZE_1_3 == offsetof(kvs_restore_plan, n_stages), "plan 1.3 size");

AT(kvs_stage_desc, struct_size, 0, 4);
AT(kvs_stage_desc, n_stages, 4, 4);
AT(kvs_stage_desc, n_kv_layers, 8, 4);
AT(kvs_stage_desc, boundary_layers, 12, 4);
AT(kvs_stage_desc, first_layer, 16, 4 * KVS_MAX_STAGES);
SIZE(kvs_stage_desc, 48);
_Static_assert(KVS_STAGE_DESC_SIZE_1_4 == 48, "stage desc first size");

AT(kvs_stats, struct_size, 0, 4);
AT(kvs_stats, lookups, 8, 8);
AT(kvs_stats, lookup_hit_tokens, 16, 8);
AT(kvs_stats, lookup_miss_tokens, 24, 8);
AT(kvs_stats, chunks_loaded, 32, 8);
AT(kvs_stats, bytes_loaded, 40, 8);
AT(kvs_stats, load_ns, 48, 8);
AT(kvs_stats, chunks_saved, 56, 8);
AT(kvs_stats, bytes_saved, 64, 8);
AT(kvs_stats, save_ns, 72, 8);
AT(kvs_stats, saves_skipped, 80, 8);
AT(kvs_stats, load_errors, 88, 8);
AT(kvs_stats, evictions, 96, 8);
AT(kvs_stats, leases_active, 104, 8);
AT(kvs_stats, leases_expired, 112, 8);
AT(kvs_stats, load_gbps, 120, 8);
AT(kvs_stats, save_gbps, 128, 8);
AT(kvs_stats, n_tiers, 136, 4);
AT(kvs_stats, tier_chunks_loaded, 144, 8 * KVS_STATS_MAX_TIERS);
_Static_assert(KVS_STATS_SIZE_1_2 == offsetof(kvs_stats, tokens_loaded), "stats 1.2 size");
AT(kvs_stats, tokens_loaded, 208, 8); /* 1.5 */
AT(kvs_stats, tier_bytes_loaded, 216, 8 * KVS_STATS_MAX_TIERS);
AT(kvs_stats, tier_load_ns, 280, 8 * KVS_STATS_MAX_TIERS);
AT(kvs_stats, async_loads_started, 344, 8);
AT(kvs_stats, async_loads_done, 352, 8);
AT(kvs_stats, async_loads_failed, 360, 8);
AT(kvs_stats, steps_closed, 368, 8);
AT(kvs_stats, lookups_unknown, 376, 8);
AT(kvs_stats, lossy_chunks_loaded, 384, 8);
AT(kvs_stats, saves_async, 392, 8); /* 1.10 */
AT(kvs_stats, saves_in_flight, 400, 8);
AT(kvs_stats, sends_reported, 408, 8);
AT(kvs_stats, integrity_rejects, 416, 8); /* 1.11 */
SIZE(kvs_stats, 424);
_Static_assert(KVS_STATS_SIZE_1_0 == offsetof(kvs_stats, n_tiers), "stats 1.0 size");

AT(kvs_api, abi_major, 0, 4);
AT(kvs_api, abi_minor, 4, 4);
AT(kvs_api, struct_size, 8, 4);
AT(kvs_api, reserved, 12, 4);
AT(kvs_api, strerror, 16, 8);
AT(kvs_api, open, 24, 8);
AT(kvs_api, close, 32, 8);
AT(kvs_api, last_error, 40, 8);
AT(kvs_api, lookup, 48, 8);
AT(kvs_api, on_alloc, 56, 8);
AT(kvs_api, build_meta, 64, 8);
AT(kvs_api, request_finished, 72, 8);
AT(kvs_api, take_events, 80, 8);
AT(kvs_api, register_kv, 88, 8);
AT(kvs_api, bind_meta, 96, 8);
AT(kvs_api, start_load, 104, 8);
AT(kvs_api, wait_layer_load, 112, 8);
AT(kvs_api, save_layer, 120, 8);
AT(kvs_api, wait_save, 128, 8);
AT(kvs_api, get_finished, 136, 8);
AT(kvs_api, load_error_blocks, 144, 8);
AT(kvs_api, stats, 152, 8);         /* end of 1.0 */
AT(kvs_api, set_stream, 160, 8);    /* 1.1 */
AT(kvs_api, set_plan_caps, 168, 8); /* 1.3 */
AT(kvs_api, plan, 176, 8);
AT(kvs_api, set_stages, 184, 8);   /* 1.4 */
AT(kvs_api, tier_name, 192, 8);    /* 1.5 */
AT(kvs_api, load_dropped, 200, 8); /* 1.7 */
AT(kvs_api, lsc_reserve, 208, 8);  /* 1.8 */
AT(kvs_api, lsc_fetch, 216, 8);
AT(kvs_api, lsc_store, 224, 8);
AT(kvs_api, sparse_begin, 232, 8); /* 1.9 */
AT(kvs_api, sparse_select, 240, 8);
AT(kvs_api, sparse_wait, 248, 8);
AT(kvs_api, sparse_stats, 256, 8);
AT(kvs_api, sparse_end, 264, 8);
AT(kvs_api, request_key_input, 272, 8); /* 1.10 */
AT(kvs_api, build_meta_update, 280, 8);
AT(kvs_api, handle_info, 288, 8);
AT(kvs_handle_info, struct_size, 0, 4); /* 1.10 */
AT(kvs_handle_info, role, 4, 4);
AT(kvs_handle_info, transfer_role, 8, 4);
AT(kvs_handle_info, chunk_tokens, 12, 4);
AT(kvs_handle_info, key_ranks, 16, 4);
AT(kvs_handle_info, n_tiers, 20, 4);
AT(kvs_handle_info, save_decode, 24, 4);
AT(kvs_handle_info, saves_async, 28, 4);
AT(kvs_handle_info, lease_timeout_ms, 32, 8);
SIZE(kvs_handle_info, KVS_HANDLE_INFO_SIZE_1_10);
AT(kvs_api, store_api, 296, 8); /* 1.12 */
SIZE(kvs_api, 304);

/* the store API (kvstrata_store.h): its own table and version */
AT(kvs_store_open_params, struct_size, 0, 4);
AT(kvs_store_open_params, threads, 4, 4);
AT(kvs_store_open_params, config_path, 8, 8);
AT(kvs_store_open_params, namespace_bytes, 16, 8);
AT(kvs_store_open_params, namespace_len, 24, 8);
AT(kvs_store_open_params, tenant, 32, 8);
AT(kvs_store_open_params, max_value_bytes, 40, 8);
AT(kvs_store_open_params, event_capacity, 48, 4);
SIZE(kvs_store_open_params, KVS_STORE_OPEN_PARAMS_SIZE_1_0);
AT(kvs_store_keys, data, 0, 8);
AT(kvs_store_keys, offsets, 8, 8);
AT(kvs_store_keys, n, 16, 8);
AT(kvs_store_iov, base, 0, 8);
AT(kvs_store_iov, len, 8, 8);
AT(kvs_store_sg, iov, 0, 8);
AT(kvs_store_sg, seg, 8, 8);
AT(kvs_store_result, status, 0, 4);
AT(kvs_store_result, tier, 4, 2);
AT(kvs_store_result, flags, 6, 2);
AT(kvs_store_result, bytes, 8, 8);
SIZE(kvs_store_result, 16);
AT(kvs_store_tier_usage, name, 8, 64);
AT(kvs_store_tier_usage, objects, 72, 8);
AT(kvs_store_tier_usage, put_bytes, 120, 8);
SIZE(kvs_store_tier_usage, KVS_STORE_TIER_USAGE_SIZE_1_0);
AT(kvs_store_stats, gets, 8, 8);
AT(kvs_store_stats, puts, 48, 8);
AT(kvs_store_stats, exists_keys, 96, 8);
AT(kvs_store_stats, events_dropped, 136, 8);
SIZE(kvs_store_stats, KVS_STORE_STATS_SIZE_1_0);
AT(kvs_store_event, kind, 0, 1);
AT(kvs_store_event, tier, 2, 2);
AT(kvs_store_event, key_len, 4, 4);
AT(kvs_store_event, key16, 8, 16);
SIZE(kvs_store_event, KVS_STORE_EVENT_BYTES);
AT(kvs_store_api, open, 16, 8);
AT(kvs_store_api, submit, 72, 8);
AT(kvs_store_api, take_events, 120, 8);
SIZE(kvs_store_api, 128);

AT(kvs_step_update, struct_size, 0, 4); /* 1.10 */
AT(kvs_step_update, reserved, 4, 4);
AT(kvs_step_update, req_id, 8, 8);
AT(kvs_step_update, tokens_from, 16, 8);
AT(kvs_step_update, tokens, 24, 8);
AT(kvs_step_update, n_tokens, 32, 8);
AT(kvs_step_update, blocks_from, 40, 8);
AT(kvs_step_update, block_ids, 48, 8);
AT(kvs_step_update, n_block_ids, 56, 8);
AT(kvs_step_update, n_computed, 64, 8);
AT(kvs_step_update, n_scheduled, 72, 8);
SIZE(kvs_step_update, KVS_STEP_UPDATE_SIZE_1_10);

AT(kvs_sparse_cache, struct_size, 0, 4); /* 1.9 */
AT(kvs_sparse_cache, slots, 4, 4);
AT(kvs_sparse_cache, k, 8, 8);
AT(kvs_sparse_cache, v, 16, 8);
AT(kvs_sparse_cache, slot_rows, 24, 8);
AT(kvs_sparse_cache, hit, 32, 8);
AT(kvs_sparse_cache, attend_from, 40, 8);
SIZE(kvs_sparse_cache, KVS_SPARSE_CACHE_SIZE_1_9);
AT(kvs_sparse_params, struct_size, 0, 4);
AT(kvs_sparse_params, topk, 4, 4);
AT(kvs_sparse_params, sink, 8, 4);
AT(kvs_sparse_params, recent, 12, 4);
AT(kvs_sparse_params, q_per_kv, 16, 4);
AT(kvs_sparse_params, eta, 20, 4);
AT(kvs_sparse_params, p, 24, 4);
AT(kvs_sparse_params, reserved, 28, 4);
AT(kvs_sparse_params, importance, 32, 8);
AT(kvs_sparse_params, max_tokens, 40, 8);
AT(kvs_sparse_params, layout, 48, 4);
AT(kvs_sparse_params, profile_steps, 52, 4);
AT(kvs_sparse_params, cluster_cache_rows, 56, 8);
AT(kvs_sparse_params, cluster_cache, 64, 4);
AT(kvs_sparse_params, min_useful, 68, 4);
AT(kvs_sparse_params, index, 72, 4);
AT(kvs_sparse_params, audit_every, 76, 4);
AT(kvs_sparse_params, target_error, 80, 4);
AT(kvs_sparse_params, score_scale, 84, 4);
SIZE(kvs_sparse_params, KVS_SPARSE_PARAMS_SIZE_1_9);
AT(kvs_sparse_stats, struct_size, 0, 4);
AT(kvs_sparse_stats, stored_tokens, 8, 8);
AT(kvs_sparse_stats, chunks_refused, 16, 8);
AT(kvs_sparse_stats, steps, 24, 8);
AT(kvs_sparse_stats, head_hits, 32, 8);
AT(kvs_sparse_stats, head_misses, 40, 8);
AT(kvs_sparse_stats, rows_fetched, 48, 8);
AT(kvs_sparse_stats, bytes_fetched, 56, 8);
AT(kvs_sparse_stats, rows_failed, 64, 8);
AT(kvs_sparse_stats, spec_steps, 72, 8);
AT(kvs_sparse_stats, spec_corrected, 80, 8);
AT(kvs_sparse_stats, spec_kept, 88, 8);
AT(kvs_sparse_stats, select_ns, 96, 8);
AT(kvs_sparse_stats, fetch_ns, 104, 8);
AT(kvs_sparse_stats, layouts_found, 112, 8);
AT(kvs_sparse_stats, layouts_written, 120, 8);
AT(kvs_sparse_stats, reclustered, 128, 8);
AT(kvs_sparse_stats, clusters_read, 136, 8);
AT(kvs_sparse_stats, cluster_bytes_read, 144, 8);
AT(kvs_sparse_stats, cluster_cache_hits, 152, 8);
AT(kvs_sparse_stats, rows_from_clusters, 160, 8);
AT(kvs_sparse_stats, keys_scored, 168, 8);
AT(kvs_sparse_stats, medoid_selections, 176, 8);
AT(kvs_sparse_stats, audits, 184, 8);
AT(kvs_sparse_stats, audit_error_micro, 192, 8);
AT(kvs_sparse_stats, tau_raised, 200, 8);
AT(kvs_sparse_stats, tau_lowered, 208, 8);
SIZE(kvs_sparse_stats, KVS_SPARSE_STATS_SIZE_1_9);

SIZE(kvs_key, 16);
AT(kvs_backend_option, key, 0, 8);
AT(kvs_backend_option, value, 8, 8);
SIZE(kvs_backend_option, 16);
AT(kvs_backend_host, struct_size, 0, 4);
AT(kvs_backend_host, ctx, 8, 8);
AT(kvs_backend_host, log, 16, 8);
AT(kvs_backend_host, on_evict, 24, 8);
AT(kvs_backend_host, place, 32, 8);
AT(kvs_backend_host, schedule, 40, 8);
AT(kvs_backend_host, on_put_dropped, 48, 8); /* 1.3 */
AT(kvs_backend_host, encodings, 56, 8);      /* 1.5 */
AT(kvs_backend_host, encode, 64, 8);
AT(kvs_backend_host, plan, 72, 8);
AT(kvs_backend_host, reevaluate_ms, 80, 8);
SIZE(kvs_backend_host, 88);
AT(kvs_backend_encoding, id, 0, 4);
AT(kvs_backend_encoding, codec, 4, 2);
AT(kvs_backend_encoding, bits, 6, 1);
AT(kvs_backend_encoding, flags, 7, 1);
AT(kvs_backend_encoding, bytes, 8, 8);
AT(kvs_backend_encoding, quality, 16, 8);
SIZE(kvs_backend_encoding, 24);
AT(kvs_backend_place_entry, raw_bytes, 0, 8);
AT(kvs_backend_place_entry, hits_per_s, 8, 8);
AT(kvs_backend_place_entry, n_encodings, 16, 4);
AT(kvs_backend_place_entry, allowed, 20, 4);
AT(kvs_backend_place_entry, devices, 24, 4);
AT(kvs_backend_place_entry, encodings, 32, 24 * KVS_BACKEND_MAX_ENCODINGS);
SIZE(kvs_backend_place_entry, 32 + 24 * KVS_BACKEND_MAX_ENCODINGS);
AT(kvs_backend_devices, latency_s, 0, 16);
AT(kvs_backend_devices, bytes_per_s, 16, 16);
AT(kvs_backend_devices, capacity, 32, 16);
AT(kvs_backend_devices, recompute_s, 48, 8);
SIZE(kvs_backend_devices, 56);
AT(kvs_backend_place_choice, device, 0, 1);
AT(kvs_backend_place_choice, encoding, 1, 1);
SIZE(kvs_backend_place_choice, 2);
AT(kvs_backend_init, struct_size, 0, 4);
AT(kvs_backend_init, tier_name, 8, 8);
AT(kvs_backend_init, capacity_bytes, 16, 8);
AT(kvs_backend_init, max_object_bytes, 24, 8);
AT(kvs_backend_init, options, 32, 8);
AT(kvs_backend_init, n_options, 40, 8);
AT(kvs_backend_init, host, 48, 8);
AT(kvs_backend_init, error, 56, 8);
AT(kvs_backend_init, error_len, 64, 8);
AT(kvs_backend_init, staging_base, 72, 8); /* 1.1 */
AT(kvs_backend_init, staging_len, 80, 8);
AT(kvs_backend_init, error_option, 88, 8); /* 1.3 */
AT(kvs_backend_init, error_option_len, 96, 8);
SIZE(kvs_backend_init, 104);
AT(kvs_backend_ops, abi_major, 0, 4);
AT(kvs_backend_ops, abi_minor, 4, 4);
AT(kvs_backend_ops, struct_size, 8, 4);
AT(kvs_backend_ops, caps, 12, 4);
AT(kvs_backend_ops, type_name, 16, 8);
AT(kvs_backend_ops, create, 24, 8);
AT(kvs_backend_ops, destroy, 32, 8);
AT(kvs_backend_ops, last_error, 40, 8);
AT(kvs_backend_ops, contains, 48, 8);
AT(kvs_backend_ops, pin, 56, 8);
AT(kvs_backend_ops, unpin, 64, 8);
AT(kvs_backend_ops, get, 72, 8);
AT(kvs_backend_ops, get_ref, 80, 8);
AT(kvs_backend_ops, put, 88, 8);
AT(kvs_backend_ops, remove, 96, 8);
AT(kvs_backend_ops, usage, 104, 8); /* end of 1.0 */
AT(kvs_backend_ops, reserve, 112, 8);
AT(kvs_backend_ops, commit, 120, 8);
AT(kvs_backend_ops, abort, 128, 8);
AT(kvs_backend_ops, memory, 136, 8);
AT(kvs_backend_ops, get_many, 144, 8);
AT(kvs_backend_ops, get_range, 152, 8);      /* 1.2 */
AT(kvs_backend_ops, get_many_start, 160, 8); /* 1.4 */
AT(kvs_backend_ops, get_many_finish, 168, 8);
AT(kvs_backend_ops, codecs, 176, 8);        /* 1.5 */
AT(kvs_backend_ops, put_range, 184, 8);     /* 1.6 */
AT(kvs_backend_ops, instance_caps, 192, 8); /* 1.8 */
SIZE(kvs_backend_ops, 200);

/* --- the library, as an engine loads it ----------------------------------------------------------- */

#ifndef KVS_TEST_LIB
#define KVS_TEST_LIB "build/lib/libkvstrata.so"
#endif

enum { LAYERS = 2, HEADS = 2, HEAD_DIM = 16, BT = 16, BLOCKS = 16, CHUNK = 256 };
#define TOKEN_BYTES (HEADS * HEAD_DIM * 2)
#define LAYER_BYTES ((size_t)2 * BLOCKS * BT * TOKEN_BYTES)

static void *lib;
static const kvs_api *api;

static void setup(void) {
    lib = dlopen(KVS_TEST_LIB, RTLD_NOW | RTLD_LOCAL);
    ck_assert_msg(lib != NULL, "dlopen %s: %s", KVS_TEST_LIB, dlerror());
    const kvs_api *(*get)(uint32_t);
    *(void **)&get = dlsym(lib, "kvs_get_api");
    ck_assert_ptr_nonnull(get);
    api = get(KVS_ABI_MAJOR);
    ck_assert_ptr_nonnull(api);
    ck_assert_uint_ge(api->struct_size, offsetof(kvs_api, set_stages) + sizeof api->set_stages);
}

static void teardown(void) {
    ck_assert_msg(dlclose(lib) == 0, "dlclose: %s", dlerror());
}

static kvs_model_desc model(void) {
    return (kvs_model_desc){.struct_size = sizeof(kvs_model_desc),
                            .model_id = "abi-model",
                            .dtype = KVS_DTYPE_FP16,
                            .n_layers = LAYERS,
                            .n_kv_heads = HEADS,
                            .head_dim = HEAD_DIM,
                            .block_tokens = BT,
                            .tp_size = 1,
                            .vocab_size = 1000};
}

/* open with params and model given as raw bytes of the sizes a caller may have been built with */
static kvs_status open_sized(uint32_t params_size, const void *model_bytes, kvs_handle **h,
                             char *err) {
    unsigned char params[64] = {0};
    kvs_open_params p = {.struct_size = params_size,
                         .role = KVS_ROLE_BOTH,
                         .config_path = NULL,
                         .model = model_bytes};
    memcpy(params, &p, sizeof p);
    memset(params + sizeof p, 0x5a,
           sizeof params - sizeof p); /* a newer engine's fields we do not know */
    return api->open((const kvs_open_params *)params, h, err, 512);
}

START_TEST(structs_of_their_first_size_are_accepted_and_read_the_rest_as_zero) {
    /* A model description from before vocab_size: whatever follows it in memory is not read. */
    unsigned char bytes[sizeof(kvs_model_desc)];
    kvs_model_desc m = model();
    m.struct_size = KVS_MODEL_DESC_SIZE_1_0;
    m.vocab_size = 1; /* past the caller's struct: must read as 0 (only negatives checked) */
    memcpy(bytes, &m, sizeof m);
    kvs_handle *h = NULL;
    char err[512];
    ck_assert_msg(open_sized(KVS_OPEN_PARAMS_SIZE_1_0, bytes, &h, err) == KVS_OK, "%s", err);
    int32_t tokens[4] = {500, 501, 502, 503};
    kvs_lookup_result res = {.struct_size = KVS_LOOKUP_RESULT_SIZE_1_0};
    ck_assert_msg(api->lookup(h, "r", tokens, 4, 0, &res) == KVS_OK, "%s", api->last_error(h));
    api->close(h);
    /* the same model with vocab_size inside the caller's struct is checked */
    m.struct_size = sizeof m;
    ck_assert_int_eq(open_sized(sizeof(kvs_open_params), &m, &h, err), KVS_OK);
    ck_assert_int_eq(api->lookup(h, "r", tokens, 4, 0, &res), KVS_EINVAL);
    api->close(h);
}
END_TEST

START_TEST(structs_below_their_first_size_are_refused_with_a_sentence) {
    kvs_model_desc m = model();
    kvs_handle *h = NULL;
    char err[512];
    m.struct_size = KVS_MODEL_DESC_SIZE_1_0 - 1;
    ck_assert_int_eq(open_sized(sizeof(kvs_open_params), &m, &h, err), KVS_EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "model struct_size 55 is below the 1.0 size 56"));
    m.struct_size = sizeof m;
    ck_assert_int_eq(open_sized(KVS_OPEN_PARAMS_SIZE_1_0 - 1, &m, &h, err), KVS_EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "params struct_size 23"));
    ck_assert_ptr_null(h);
    ck_assert_int_eq(open_sized(sizeof(kvs_open_params), &m, &h, err), KVS_OK);
    int32_t tokens[4] = {1, 2, 3, 4};
    kvs_lookup_result res = {.struct_size = 0};
    ck_assert_int_eq(api->lookup(h, "r", tokens, 4, 0, &res), KVS_EINVAL);
    ck_assert_ptr_nonnull(strstr(api->last_error(h), "struct_size 0 is below the 1.0 size 24"));
    kvs_stats st = {.struct_size = 0}; /* 0 used to mean "everything" */
    ck_assert_int_eq(api->stats(h, &st), KVS_EINVAL);
    st.struct_size = KVS_STATS_SIZE_1_0 - 1;
    ck_assert_int_eq(api->stats(h, &st), KVS_EINVAL);
    kvs_restore_plan plan = {.struct_size = KVS_RESTORE_PLAN_SIZE_1_3 - 1};
    ck_assert_int_eq(api->plan(h, "r", &plan), KVS_EINVAL);
    kvs_stage_desc d = {.struct_size = KVS_STAGE_DESC_SIZE_1_4 - 1};
    ck_assert_int_eq(api->set_stages(h, &d), KVS_EINVAL);
    ck_assert_ptr_nonnull(strstr(api->last_error(h), "below 48"));
    api->close(h);
}
END_TEST

/* A layer view as a newer engine might have it: one field appended. */
typedef struct future_view {
    kvs_layer_view v;
    uint64_t appended;
} future_view;

static void future_views(future_view *views, unsigned char *pages) {
    for (int l = 0; l < LAYERS; l++) {
        unsigned char *base = pages + (size_t)l * LAYER_BYTES;
        views[l] = (future_view){.v = {.struct_size = sizeof(future_view),
                                       .device_kind = KVS_DEVICE_HOST,
                                       .n_blocks = BLOCKS,
                                       .k_base = base,
                                       .v_base = base + LAYER_BYTES / 2,
                                       .block_stride = BT * TOKEN_BYTES,
                                       .token_stride = TOKEN_BYTES,
                                       .head_stride = HEAD_DIM * 2},
                                 .appended = 0xdeadbeefull};
    }
}

START_TEST(a_newer_engine_s_larger_structs_are_accepted_and_views_step_by_their_size) {
    unsigned char bytes[sizeof(kvs_model_desc) + 16];
    kvs_model_desc m = model();
    m.struct_size = sizeof bytes;
    memcpy(bytes, &m, sizeof m);
    memset(bytes + sizeof m, 0x77, 16);
    kvs_handle *h = NULL;
    char err[512];
    ck_assert_msg(open_sized(40, bytes, &h, err) == KVS_OK, "%s", err);
    unsigned char *pages = calloc(LAYERS, LAYER_BYTES);
    future_view views[LAYERS];
    future_views(views, pages);
    ck_assert_msg(api->register_kv(h, &views[0].v, LAYERS) == KVS_OK, "%s", api->last_error(h));
    /* save a chunk from blocks 0..15 and restore it into the same pages after wiping them: layer 1 is
     * found at the array's stride, not at this library's sizeof(kvs_layer_view) */
    int32_t tokens[CHUNK + 1];
    uint32_t blocks[BLOCKS + 1];
    for (int i = 0; i <= CHUNK; i++) tokens[i] = i * 3 % 1000;
    for (uint32_t b = 0; b <= BLOCKS; b++) blocks[b] = b % BLOCKS;
    for (size_t i = 0; i < (size_t)LAYERS * LAYER_BYTES; i++)
        pages[i] = (unsigned char)(i * 13 + i / 4099);
    kvs_step_request s = {"w", tokens, CHUNK, blocks, BLOCKS, 0, CHUNK};
    unsigned char meta[8192];
    uint64_t len = 0;
    ck_assert_int_eq(api->build_meta(h, &s, 1, meta, sizeof meta, &len), KVS_OK);
    ck_assert_int_eq(api->bind_meta(h, meta, len), KVS_OK);
    ck_assert_int_eq(api->start_load(h), KVS_OK);
    for (uint32_t l = 0; l < LAYERS; l++) ck_assert_int_eq(api->save_layer(h, l), KVS_OK);
    ck_assert_int_eq(api->wait_save(h), KVS_OK);
    unsigned char *want = malloc((size_t)LAYERS * LAYER_BYTES);
    memcpy(want, pages, (size_t)LAYERS * LAYER_BYTES);
    memset(pages, 0, (size_t)LAYERS * LAYER_BYTES);
    kvs_lookup_result res = {.struct_size = sizeof res};
    ck_assert_int_eq(api->lookup(h, "r", tokens, CHUNK + 1, 0, &res), KVS_OK);
    ck_assert_uint_eq(res.n_hit_tokens, CHUNK);
    ck_assert_int_eq(api->on_alloc(h, "r", blocks, BLOCKS + 1, CHUNK), KVS_OK);
    kvs_step_request r = {"r", tokens, CHUNK + 1, blocks, BLOCKS + 1, CHUNK, 1};
    ck_assert_int_eq(api->build_meta(h, &r, 1, meta, sizeof meta, &len), KVS_OK);
    ck_assert_int_eq(api->bind_meta(h, meta, len), KVS_OK);
    ck_assert_int_eq(api->start_load(h), KVS_OK);
    for (uint32_t l = 0; l < LAYERS; l++) ck_assert_int_eq(api->wait_layer_load(h, l), KVS_OK);
    ck_assert_int_eq(api->wait_save(h), KVS_OK);
    ck_assert_mem_eq(pages, want,
                     (size_t)LAYERS * LAYER_BYTES); /* every byte of both layers back */
    /* a larger stage description is read up to what this library knows */
    unsigned char stage_bytes[sizeof(kvs_stage_desc) + 8] = {0};
    kvs_stage_desc d = {.struct_size = sizeof stage_bytes,
                        .n_stages = 2,
                        .n_kv_layers = 3,
                        .boundary_layers = 1,
                        .first_layer = {0, 1}};
    memcpy(stage_bytes, &d, sizeof d);
    api->close(h);
    m.n_layers = 4;
    memcpy(bytes, &m, sizeof m);
    ck_assert_int_eq(open_sized(sizeof(kvs_open_params), bytes, &h, err), KVS_OK);
    ck_assert_msg(api->set_stages(h, (const kvs_stage_desc *)stage_bytes) == KVS_OK, "%s",
                  api->last_error(h));
    api->close(h);
    free(want);
    free(pages);
}
END_TEST

START_TEST(views_whose_sizes_differ_are_refused) {
    kvs_model_desc m = model();
    kvs_handle *h = NULL;
    char err[512];
    ck_assert_int_eq(open_sized(sizeof(kvs_open_params), &m, &h, err), KVS_OK);
    unsigned char *pages = calloc(LAYERS, LAYER_BYTES);
    future_view views[LAYERS];
    future_views(views, pages);
    views[1].v.struct_size = sizeof(kvs_layer_view);
    ck_assert_int_eq(api->register_kv(h, &views[0].v, LAYERS), KVS_EINVAL);
    ck_assert_ptr_nonnull(strstr(api->last_error(h), "layer 1: struct_size 56 differs"));
    views[1].v.struct_size = views[0].v.struct_size = KVS_LAYER_VIEW_SIZE_1_0 - 8;
    ck_assert_int_eq(api->register_kv(h, &views[0].v, LAYERS), KVS_EINVAL);
    api->close(h);
    free(pages);
}
END_TEST

START_TEST(outbound_structs_are_written_no_further_than_their_struct_size) {
    kvs_model_desc m = model();
    kvs_handle *h = NULL;
    char err[512];
    ck_assert_int_eq(open_sized(sizeof(kvs_open_params), &m, &h, err), KVS_OK);
    union {
        kvs_stats s;
        unsigned char bytes[sizeof(kvs_stats) + 64];
    } st;
    memset(&st, 0xab, sizeof st);
    st.s.struct_size = KVS_STATS_SIZE_1_0; /* an engine built against 1.0 */
    ck_assert_int_eq(api->stats(h, &st.s), KVS_OK);
    ck_assert_uint_eq(st.s.struct_size, KVS_STATS_SIZE_1_0);
    ck_assert_uint_eq(st.s.lookups, 0);
    for (size_t i = KVS_STATS_SIZE_1_0; i < sizeof st.bytes; i++)
        ck_assert_uint_eq(st.bytes[i], 0xab);
    memset(&st, 0xab, sizeof st);
    st.s.struct_size = sizeof st.bytes; /* a newer engine: this library writes what it has */
    ck_assert_int_eq(api->stats(h, &st.s), KVS_OK);
    ck_assert_uint_eq(st.s.struct_size, sizeof(kvs_stats));
    ck_assert_uint_eq(st.s.n_tiers, 1);
    for (size_t i = sizeof(kvs_stats); i < sizeof st.bytes; i++)
        ck_assert_uint_eq(st.bytes[i], 0xab);
    union {
        kvs_lookup_result r;
        unsigned char bytes[sizeof(kvs_lookup_result) + 16];
    } lr;
    memset(&lr, 0xab, sizeof lr);
    lr.r.struct_size = sizeof lr.bytes;
    int32_t tokens[4] = {1, 2, 3, 4};
    ck_assert_int_eq(api->lookup(h, "r", tokens, 4, 0, &lr.r), KVS_OK);
    ck_assert_uint_eq(lr.r.n_hit_tokens, 0);
    ck_assert_uint_eq(lr.r.struct_size, sizeof(kvs_lookup_result));
    for (size_t i = sizeof(kvs_lookup_result); i < sizeof lr.bytes; i++)
        ck_assert_uint_eq(lr.bytes[i], 0xab);
    api->close(h);
}
END_TEST

/* KVS_HAS_OP and KVS_HAS_FIELD come with the backend header: a plugin needs nothing outside abi/. */
START_TEST(a_plugin_finds_what_an_older_table_offers_with_the_public_macros) {
    kvs_backend_ops ops;
    memset(&ops, 0, sizeof ops);
    ops.struct_size = (uint32_t)offsetof(kvs_backend_ops, reserve); /* a 1.0 table */
    ops.put = (kvs_status(*)(void *, const kvs_key *, const void *, uint64_t))1;
    ops.reserve = (kvs_status(*)(void *, const kvs_key *, uint64_t, void **,
                                 uint64_t *))1; /* past its size */
    ck_assert(KVS_HAS_OP(&ops, put));
    ck_assert(!KVS_HAS_OP(&ops, reserve));
    ck_assert(!KVS_HAS_OP(&ops, get_ref)); /* inside, but NULL */
    kvs_backend_init init = {.struct_size = (uint32_t)offsetof(kvs_backend_init, staging_base)};
    ck_assert(KVS_HAS_FIELD(&init, kvs_backend_init, error_len));
    ck_assert(!KVS_HAS_FIELD(&init, kvs_backend_init, staging_len));
}
END_TEST

static Suite *abi_suite(void) {
    Suite *s = suite_create("abi");
    TCase *tc = tcase_create("abi");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, structs_of_their_first_size_are_accepted_and_read_the_rest_as_zero);
    tcase_add_test(tc, structs_below_their_first_size_are_refused_with_a_sentence);
    tcase_add_test(tc, a_newer_engine_s_larger_structs_are_accepted_and_views_step_by_their_size);
    tcase_add_test(tc, views_whose_sizes_differ_are_refused);
    tcase_add_test(tc, outbound_structs_are_written_no_further_than_their_struct_size);
    tcase_add_test(tc, a_plugin_finds_what_an_older_table_offers_with_the_public_macros);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    SRunner *sr = srunner_create(abi_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
