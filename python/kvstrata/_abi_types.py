"""The C ABI of abi/kvstrata.h (1.12) as ctypes sees it, with the restore plans of kvstrata_plans.h,
the KVS_PLAN_CAP_MASK of kvstrata_lossy.h and the store API of kvstrata_store.h (store ABI 1.0):
their constants, every struct in header order, and the tables (kvs_api, kvs_store_api) as Structures
of function pointers. No library is loaded here; kvstrata._abi binds the handle's calls and re-exports
every name of abi/kvstrata.h, kvstrata.store binds the store's."""

import ctypes

ABI_MAJOR = 1
ABI_MINOR = 12  # the minor version this binding was written against

# --- enums and constants (abi/kvstrata.h) -----------------------------------------------------------

OK = 0
EINVAL = -1
ENOMEM = -2
ENOTFOUND = -3
EIO = -4
ECONFIG = -5
EVERSION = -6
ESTATE = -7
ETIMEDOUT = -8
ENOTSUP = -9
ECORRUPT = -10
EAGAIN = -11
EOVERFLOW = -12

ROLE_SCHEDULER = 1
ROLE_WORKER = 2
ROLE_BOTH = 3

# kvs_transfer_role (1.10, kvs_open_params.transfer_role): vLLM's kv_role
TRANSFER_BOTH = 0
TRANSFER_PRODUCER = 1
TRANSFER_CONSUMER = 2

DTYPE_FP16 = 1
DTYPE_BF16 = 2
DTYPE_FP32 = 3
DTYPE_FP8_E4M3 = 4
DTYPE_FP8_E5M2 = 5

DTYPE_BYTES = {DTYPE_FP16: 2, DTYPE_BF16: 2, DTYPE_FP32: 4, DTYPE_FP8_E4M3: 1, DTYPE_FP8_E5M2: 1}
DTYPE_NAMES = {DTYPE_FP16: "fp16", DTYPE_BF16: "bf16", DTYPE_FP32: "fp32",
               DTYPE_FP8_E4M3: "fp8_e4m3", DTYPE_FP8_E5M2: "fp8_e5m2"}

DEVICE_HOST = 0
DEVICE_CUDA = 1

EVENT_STORED = 1
EVENT_REMOVED = 2

MAX_STAGES = 8
STATS_MAX_TIERS = 8

PLAN_CAP_TOKEN = 1
PLAN_CAP_LAYER = 2
PLAN_CAP_STAGE = 4
PLAN_CAP_MASK = 8  # 1.7: attention masks what load_dropped reports (the vLLM connector does not)

PLAN_LOAD = 0
PLAN_TOKEN = 1
PLAN_RECOMPUTE = 2
PLAN_LAYER = 3
PLAN_STAGE = 4

MODEL_DESC_SIZE_1_0 = 56
OPEN_PARAMS_SIZE_1_0 = 24
LAYER_VIEW_SIZE_1_0 = 56
LOOKUP_RESULT_SIZE_1_0 = 24
RESTORE_PLAN_SIZE_1_3 = 48
STAGE_DESC_SIZE_1_4 = 48
STATS_SIZE_1_0 = 136
STATS_SIZE_1_2 = 208

MAX_REQ_ID_BYTES = 255

# --- structs ----------------------------------------------------------------------------------------

c_status = ctypes.c_int


class ModelDesc(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("model_id", ctypes.c_char_p),
        ("dtype", ctypes.c_uint32),
        ("n_layers", ctypes.c_uint32),
        ("n_kv_heads", ctypes.c_uint32),
        ("head_dim", ctypes.c_uint32),
        ("block_tokens", ctypes.c_uint32),
        ("is_mla", ctypes.c_uint32),
        ("tp_rank", ctypes.c_uint32),
        ("tp_size", ctypes.c_uint32),
        ("salt", ctypes.c_char_p),
        ("vocab_size", ctypes.c_uint32),
    ]


class OpenParams(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("role", ctypes.c_uint32),
        ("config_path", ctypes.c_char_p),
        ("model", ctypes.POINTER(ModelDesc)),
        # 1.10
        ("transfer_role", ctypes.c_uint32),
    ]


class LayerView(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("device_kind", ctypes.c_uint32),
        ("device_index", ctypes.c_int32),
        ("n_blocks", ctypes.c_uint32),
        ("k_base", ctypes.c_void_p),
        ("v_base", ctypes.c_void_p),
        ("block_stride", ctypes.c_int64),
        ("token_stride", ctypes.c_int64),
        ("head_stride", ctypes.c_int64),
    ]


class LookupResult(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("n_hit_tokens", ctypes.c_uint64),
        ("unknown_yet", ctypes.c_uint8),
        ("load_async", ctypes.c_uint8),
        # 1.6
        ("n_lossy_tokens", ctypes.c_uint64),
        # 1.10
        ("chunk_tokens", ctypes.c_uint32),
    ]


class StepRequest(ctypes.Structure):
    _fields_ = [
        ("req_id", ctypes.c_char_p),
        ("tokens", ctypes.POINTER(ctypes.c_int32)),
        ("n_tokens", ctypes.c_uint64),
        ("block_ids", ctypes.POINTER(ctypes.c_uint32)),
        ("n_block_ids", ctypes.c_uint64),
        ("n_computed", ctypes.c_uint64),
        ("n_scheduled", ctypes.c_uint64),
    ]


class Event(ctypes.Structure):
    _fields_ = [
        ("kind", ctypes.c_uint8),
        ("key", ctypes.c_uint8 * 16),
        ("tier", ctypes.c_uint32),
    ]


class RestorePlan(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("mode", ctypes.c_uint32),
        ("first_token", ctypes.c_uint64),
        ("end_token", ctypes.c_uint64),
        ("recompute_tokens", ctypes.c_uint64),
        ("predicted_ms", ctypes.c_double),
        ("recompute_layers", ctypes.c_uint32),
        ("reserved", ctypes.c_uint32),
        ("n_stages", ctypes.c_uint32),
        ("stage_recompute_layers", ctypes.c_uint32 * MAX_STAGES),
    ]


class StageDesc(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("n_stages", ctypes.c_uint32),
        ("n_kv_layers", ctypes.c_uint32),
        ("boundary_layers", ctypes.c_uint32),
        ("first_layer", ctypes.c_uint32 * MAX_STAGES),
    ]


class Stats(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("lookups", ctypes.c_uint64),
        ("lookup_hit_tokens", ctypes.c_uint64),
        ("lookup_miss_tokens", ctypes.c_uint64),
        ("chunks_loaded", ctypes.c_uint64),
        ("bytes_loaded", ctypes.c_uint64),
        ("load_ns", ctypes.c_uint64),
        ("chunks_saved", ctypes.c_uint64),
        ("bytes_saved", ctypes.c_uint64),
        ("save_ns", ctypes.c_uint64),
        ("saves_skipped", ctypes.c_uint64),
        ("load_errors", ctypes.c_uint64),
        ("evictions", ctypes.c_uint64),
        ("leases_active", ctypes.c_uint64),
        ("leases_expired", ctypes.c_uint64),
        ("load_gbps", ctypes.c_double),
        ("save_gbps", ctypes.c_double),
        # 1.2
        ("n_tiers", ctypes.c_uint32),
        ("tier_chunks_loaded", ctypes.c_uint64 * STATS_MAX_TIERS),
        # 1.5
        ("tokens_loaded", ctypes.c_uint64),
        ("tier_bytes_loaded", ctypes.c_uint64 * STATS_MAX_TIERS),
        ("tier_load_ns", ctypes.c_uint64 * STATS_MAX_TIERS),
        ("async_loads_started", ctypes.c_uint64),
        ("async_loads_done", ctypes.c_uint64),
        ("async_loads_failed", ctypes.c_uint64),
        ("steps_closed", ctypes.c_uint64),
        ("lookups_unknown", ctypes.c_uint64),
        # 1.6
        ("lossy_chunks_loaded", ctypes.c_uint64),
        # 1.10
        ("saves_async", ctypes.c_uint64),
        ("saves_in_flight", ctypes.c_uint64),
        ("sends_reported", ctypes.c_uint64),
        # 1.11
        ("integrity_rejects", ctypes.c_uint64),
    ]


def stats_dict(s):
    """A Stats as a dict of its fields; the per-tier arrays as lists of n_tiers entries."""
    out = {}
    n_tiers = min(int(s.n_tiers), STATS_MAX_TIERS)
    for name, _t in Stats._fields_:
        v = getattr(s, name)
        if name.startswith("tier_"):
            v = [int(x) for x in v[:n_tiers]]
        elif isinstance(v, float):
            v = float(v)
        else:
            v = int(v)
        out[name] = v
    return out


class StepUpdateStruct(ctypes.Structure):
    """struct kvs_step_update (1.10): one request of a step as what changed."""

    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("reserved", ctypes.c_uint32),
        ("req_id", ctypes.c_char_p),
        ("tokens_from", ctypes.c_uint64),
        ("tokens", ctypes.POINTER(ctypes.c_int32)),
        ("n_tokens", ctypes.c_uint64),
        ("blocks_from", ctypes.c_uint64),
        ("block_ids", ctypes.POINTER(ctypes.c_uint32)),
        ("n_block_ids", ctypes.c_uint64),
        ("n_computed", ctypes.c_uint64),
        ("n_scheduled", ctypes.c_uint64),
    ]


STEP_UPDATE_SIZE_1_10 = 80


class HandleInfo(ctypes.Structure):
    """struct kvs_handle_info (1.10): what a handle was opened with."""

    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("role", ctypes.c_uint32),
        ("transfer_role", ctypes.c_uint32),
        ("chunk_tokens", ctypes.c_uint32),
        ("key_ranks", ctypes.c_uint32),
        ("n_tiers", ctypes.c_uint32),
        ("save_decode", ctypes.c_uint32),
        ("saves_async", ctypes.c_uint32),
        ("lease_timeout_ms", ctypes.c_uint64),
    ]


class _Handle(ctypes.Structure):  # opaque kvs_handle
    pass


_H = ctypes.POINTER(_Handle)
_F = ctypes.CFUNCTYPE


class Api(ctypes.Structure):
    """struct kvs_api, fields in header order. Read a hook only when struct_size covers it."""

    _fields_ = [
        ("abi_major", ctypes.c_uint32),
        ("abi_minor", ctypes.c_uint32),
        ("struct_size", ctypes.c_uint32),
        ("reserved", ctypes.c_uint32),
        ("strerror", _F(ctypes.c_char_p, c_status)),
        ("open", _F(c_status, ctypes.POINTER(OpenParams), ctypes.POINTER(_H), ctypes.c_char_p,
                    ctypes.c_size_t)),
        ("close", _F(None, _H)),
        ("last_error", _F(ctypes.c_char_p, _H)),
        # scheduler role
        ("lookup", _F(c_status, _H, ctypes.c_char_p, ctypes.POINTER(ctypes.c_int32),
                      ctypes.c_uint64, ctypes.c_uint64, ctypes.POINTER(LookupResult))),
        ("on_alloc", _F(c_status, _H, ctypes.c_char_p, ctypes.POINTER(ctypes.c_uint32),
                        ctypes.c_uint64, ctypes.c_uint64)),
        ("build_meta", _F(c_status, _H, ctypes.POINTER(StepRequest), ctypes.c_uint64,
                          ctypes.c_void_p, ctypes.c_uint64, ctypes.POINTER(ctypes.c_uint64))),
        ("request_finished", _F(c_status, _H, ctypes.c_char_p, ctypes.POINTER(ctypes.c_int))),
        ("take_events", _F(c_status, _H, ctypes.POINTER(Event), ctypes.c_uint64,
                           ctypes.POINTER(ctypes.c_uint64))),
        # worker role
        ("register_kv", _F(c_status, _H, ctypes.POINTER(LayerView), ctypes.c_uint32)),
        ("bind_meta", _F(c_status, _H, ctypes.c_void_p, ctypes.c_uint64)),
        ("start_load", _F(c_status, _H)),
        ("wait_layer_load", _F(c_status, _H, ctypes.c_uint32)),
        ("save_layer", _F(c_status, _H, ctypes.c_uint32)),
        ("wait_save", _F(c_status, _H)),
        ("get_finished", _F(c_status, _H, ctypes.c_char_p, ctypes.c_uint64,
                            ctypes.POINTER(ctypes.c_uint64), ctypes.c_char_p, ctypes.c_uint64,
                            ctypes.POINTER(ctypes.c_uint64))),
        ("load_error_blocks", _F(c_status, _H, ctypes.POINTER(ctypes.c_uint32), ctypes.c_uint64,
                                 ctypes.POINTER(ctypes.c_uint64))),
        ("stats", _F(c_status, _H, ctypes.POINTER(Stats))),
        # 1.1
        ("set_stream", _F(c_status, _H, ctypes.c_void_p)),
        # 1.3
        ("set_plan_caps", _F(c_status, _H, ctypes.c_uint32)),
        ("plan", _F(c_status, _H, ctypes.c_char_p, ctypes.POINTER(RestorePlan))),
        # 1.4
        ("set_stages", _F(c_status, _H, ctypes.POINTER(StageDesc))),
        # 1.5
        ("tier_name", _F(ctypes.c_char_p, _H, ctypes.c_uint32)),
        # 1.7
        (
            "load_dropped",
            _F(
                c_status,
                _H,
                ctypes.c_char_p,
                ctypes.c_uint64,
                ctypes.c_uint64,
                ctypes.POINTER(ctypes.c_uint8),
                ctypes.POINTER(ctypes.c_uint64),
            ),
        ),
        # 1.8: the layer stream cache (an engine's own KV in lent memory; not used from Python)
        ("lsc_reserve", _F(c_status, _H, ctypes.c_void_p, ctypes.c_uint32,
                           ctypes.POINTER(ctypes.c_uint32), ctypes.POINTER(ctypes.c_uint32))),
        ("lsc_fetch", _F(c_status, _H, ctypes.c_uint32, ctypes.POINTER(ctypes.c_uint32),
                         ctypes.POINTER(ctypes.c_uint32), ctypes.c_uint32)),
        ("lsc_store", _F(c_status, _H, ctypes.c_uint32, ctypes.POINTER(ctypes.c_uint32),
                         ctypes.POINTER(ctypes.c_uint32), ctypes.c_uint32)),
        # 1.9: sparse decode (docs/sparse.md; its structs are not mirrored here: not used from
        # Python yet, so the struct arguments are plain pointers)
        ("sparse_begin", _F(c_status, _H, ctypes.c_char_p, ctypes.POINTER(ctypes.c_int32),
                            ctypes.c_uint64, ctypes.c_void_p, ctypes.c_void_p,
                            ctypes.POINTER(ctypes.c_uint64))),
        ("sparse_select", _F(c_status, _H, ctypes.c_char_p, ctypes.c_uint32,
                             ctypes.POINTER(ctypes.c_float), ctypes.c_uint64, ctypes.c_uint32)),
        ("sparse_wait", _F(c_status, _H, ctypes.c_char_p, ctypes.c_uint32)),
        ("sparse_stats", _F(c_status, _H, ctypes.c_char_p, ctypes.c_void_p)),
        ("sparse_end", _F(c_status, _H, ctypes.c_char_p)),
        # 1.10
        ("request_key_input", _F(c_status, _H, ctypes.c_char_p, ctypes.c_uint64, ctypes.c_void_p,
                                 ctypes.c_uint64)),
        ("build_meta_update", _F(c_status, _H, ctypes.POINTER(StepUpdateStruct), ctypes.c_uint64,
                                 ctypes.c_void_p, ctypes.c_uint64, ctypes.POINTER(ctypes.c_uint64))),
        ("handle_info", _F(c_status, _H, ctypes.POINTER(HandleInfo))),
        # 1.12: the store API's table of a store major (StoreApi, below)
        ("store_api", _F(ctypes.c_void_p, ctypes.c_uint32)),
    ]


# The minor version that introduced each hook (the table is read only as far as it goes).
HOOK_MINOR = {
    "set_stream": 1,
    "set_plan_caps": 3,
    "plan": 3,
    "set_stages": 4,
    "tier_name": 5,
    "load_dropped": 7,
    "lsc_reserve": 8,
    "lsc_fetch": 8,
    "lsc_store": 8,
    "sparse_begin": 9,
    "sparse_select": 9,
    "sparse_wait": 9,
    "sparse_stats": 9,
    "sparse_end": 9,
    "request_key_input": 10,
    "build_meta_update": 10,
    "handle_info": 10,
    "store_api": 12,
}


# --- the store API (abi/kvstrata_store.h, store ABI 1.0) -------------------------------------------

STORE_ABI_MAJOR = 1
STORE_ABI_MINOR = 0

STORE_KEY_MAX = 1024
STORE_NAMESPACE_MAX = 4096
STORE_TENANT_MAX = 64
STORE_BATCH_MAX = 65536

# what exists answers for one key
STORE_ABSENT = 0
STORE_PRESENT = 1
STORE_UNKNOWN = 2  # only a tier across the network could tell (STORE_LOCAL)

# flags of exists and submit
STORE_LOCAL = 1 << 0
STORE_ALL = 1 << 1
STORE_OVERWRITE = 1 << 2

STORE_SKIPPED = 1  # kvs_store_result.flags: a put of a present key wrote nothing
STORE_NO_TIER = 0xFFFF

STORE_OP_GET = 1
STORE_OP_PUT = 2
STORE_OP_EXISTS = 3
STORE_OP_REMOVE = 4

STORE_MEM_HOST = 0
STORE_MEM_CUDA = 1

STORE_OPEN_PARAMS_SIZE_1_0 = 56
STORE_TIER_USAGE_SIZE_1_0 = 128
STORE_STATS_SIZE_1_0 = 144
STORE_EVENT_BYTES = 24


class StoreOpenParams(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("threads", ctypes.c_uint32),
        ("config_path", ctypes.c_char_p),
        ("namespace_bytes", ctypes.c_void_p),
        ("namespace_len", ctypes.c_uint64),
        ("tenant", ctypes.c_char_p),
        ("max_value_bytes", ctypes.c_uint64),
        ("event_capacity", ctypes.c_uint32),
        ("reserved", ctypes.c_uint32),
    ]


class StoreKeys(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("offsets", ctypes.POINTER(ctypes.c_uint64)),
        ("n", ctypes.c_uint64),
    ]


class StoreIov(ctypes.Structure):
    _fields_ = [
        ("base", ctypes.c_void_p),
        ("len", ctypes.c_uint64),
    ]


class StoreSg(ctypes.Structure):
    _fields_ = [
        ("iov", ctypes.POINTER(StoreIov)),
        ("seg", ctypes.POINTER(ctypes.c_uint64)),
    ]


class StoreResult(ctypes.Structure):
    _fields_ = [
        ("status", ctypes.c_int32),
        ("tier", ctypes.c_uint16),
        ("flags", ctypes.c_uint16),
        ("bytes", ctypes.c_uint64),
    ]


class StoreTierUsage(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("tier", ctypes.c_uint32),
        ("name", ctypes.c_char * 64),
        ("objects", ctypes.c_uint64),
        ("bytes", ctypes.c_uint64),
        ("capacity", ctypes.c_uint64),
        ("hits", ctypes.c_uint64),
        ("hit_bytes", ctypes.c_uint64),
        ("puts", ctypes.c_uint64),
        ("put_bytes", ctypes.c_uint64),
    ]


class StoreStats(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("n_tiers", ctypes.c_uint32),
        ("gets", ctypes.c_uint64),
        ("get_hits", ctypes.c_uint64),
        ("get_misses", ctypes.c_uint64),
        ("get_bytes", ctypes.c_uint64),
        ("get_ns", ctypes.c_uint64),
        ("puts", ctypes.c_uint64),
        ("puts_stored", ctypes.c_uint64),
        ("puts_skipped", ctypes.c_uint64),
        ("puts_failed", ctypes.c_uint64),
        ("put_bytes", ctypes.c_uint64),
        ("put_ns", ctypes.c_uint64),
        ("exists_keys", ctypes.c_uint64),
        ("exists_present", ctypes.c_uint64),
        ("removes", ctypes.c_uint64),
        ("corrupt", ctypes.c_uint64),
        ("batches_in_flight", ctypes.c_uint64),
        ("events_dropped", ctypes.c_uint64),
    ]


class StoreEventHeader(ctypes.Structure):
    """The fixed part of one take_events record; key_len bytes of the engine's key follow."""

    _fields_ = [
        ("kind", ctypes.c_uint8),
        ("reserved", ctypes.c_uint8),
        ("tier", ctypes.c_uint16),
        ("key_len", ctypes.c_uint32),
        ("key16", ctypes.c_uint8 * 16),
    ]


class _Store(ctypes.Structure):  # opaque kvs_store
    pass


_S = ctypes.POINTER(_Store)
_U64P = ctypes.POINTER(ctypes.c_uint64)


class StoreApi(ctypes.Structure):
    """struct kvs_store_api (store ABI 1.0), fields in header order. A later minor appends fields:
    read the table only as far as its struct_size."""

    _fields_ = [
        ("abi_major", ctypes.c_uint32),
        ("abi_minor", ctypes.c_uint32),
        ("struct_size", ctypes.c_uint32),
        ("reserved", ctypes.c_uint32),
        ("open", _F(c_status, ctypes.POINTER(StoreOpenParams), ctypes.POINTER(_S), ctypes.c_char_p,
                    ctypes.c_size_t)),
        ("close", _F(None, _S)),
        ("last_error", _F(ctypes.c_char_p, _S)),
        ("register_memory", _F(c_status, _S, ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32,
                               ctypes.c_int32, _U64P)),
        ("unregister_memory", _F(c_status, _S, ctypes.c_uint64)),
        ("exists", _F(c_status, _S, ctypes.POINTER(StoreKeys), ctypes.c_uint32, ctypes.c_uint64,
                      ctypes.POINTER(ctypes.c_uint8), _U64P)),
        ("unpin", _F(c_status, _S, ctypes.POINTER(StoreKeys))),
        ("submit", _F(c_status, _S, ctypes.c_uint32, ctypes.POINTER(StoreKeys),
                      ctypes.POINTER(StoreSg), ctypes.c_uint32, _U64P)),
        ("wait", _F(c_status, _S, ctypes.c_uint64, ctypes.c_uint64, ctypes.POINTER(StoreResult),
                    ctypes.c_uint64, _U64P)),
        ("event_fd", _F(ctypes.c_int, _S)),
        ("drain", _F(c_status, _S, _U64P, ctypes.c_uint64, _U64P)),
        ("usage", _F(c_status, _S, ctypes.POINTER(StoreTierUsage), ctypes.c_uint32,
                     ctypes.POINTER(ctypes.c_uint32))),
        ("stats", _F(c_status, _S, ctypes.POINTER(StoreStats))),
        ("take_events", _F(c_status, _S, ctypes.c_void_p, ctypes.c_uint64, _U64P, _U64P)),
    ]


# The layouts the header pins (LP64); a binding that disagrees must not load.
assert ctypes.sizeof(StoreOpenParams) == STORE_OPEN_PARAMS_SIZE_1_0
assert ctypes.sizeof(StoreTierUsage) == STORE_TIER_USAGE_SIZE_1_0
assert ctypes.sizeof(StoreStats) == STORE_STATS_SIZE_1_0
assert ctypes.sizeof(StoreEventHeader) == STORE_EVENT_BYTES
assert ctypes.sizeof(StoreResult) == 16
assert ctypes.sizeof(StoreKeys) == 24
assert ctypes.sizeof(StoreIov) == 16 and ctypes.sizeof(StoreSg) == 16
