"""The C ABI of abi/kvstrata.h (1.10) as ctypes sees it, with the restore plans of kvstrata_plans.h and
the KVS_PLAN_CAP_MASK of kvstrata_lossy.h: their constants, every struct in header order, and the table
(kvs_api) as a Structure of function pointers. No library is loaded here; kvstrata._abi binds the
calls and re-exports every name."""

import ctypes

ABI_MAJOR = 1
ABI_MINOR = 11  # the minor version this binding was written against

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
}
