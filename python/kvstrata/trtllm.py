"""kvstrata as TensorRT-LLM's KV cache connector (PyTorch backend) over libkvstrata.

Enable it with the LLM API's kv_connector_config (docs/engines/trtllm.md):
  kv_connector_config:
    connector_module: kvstrata.trtllm
    connector_scheduler_class: KvstrataTrtllmScheduler
    connector_worker_class: KvstrataTrtllmWorker

TensorRT-LLM builds the scheduler on rank 0 and a worker on every rank; each opens its own libkvstrata
handle in __init__ (the scheduler with the scheduler role, a worker with the worker role). The
scheduler's metadata is the bytes build_meta_update returns; TensorRT-LLM broadcasts it to the
workers, which bind it. The kv_connector_config section takes no options of its own, so the YAML
config is named by the environment: KVSTRATA_CONFIG (a path); without it every process opens one DRAM
tier shared through POSIX shared memory (KVSTRATA_SHM_NAME, KVSTRATA_DRAM_CAPACITY).
"""

import array
import json
import logging
import os
import shutil
import tempfile

from kvstrata import _abi

try:  # the real TensorRT-LLM classes when TensorRT-LLM is installed
    from tensorrt_llm._torch.pyexecutor.connectors.kv_cache_connector import (
        KvCacheConnectorScheduler,
        KvCacheConnectorWorker,
        SchedulerOutput,
    )

    HAVE_TRTLLM = True
except ImportError:
    from kvstrata._trtllm_standin import (
        KvCacheConnectorScheduler,
        KvCacheConnectorWorker,
        SchedulerOutput,
    )

    HAVE_TRTLLM = False

_log = logging.getLogger("kvstrata")

__all__ = [
    "KvstrataTrtllmScheduler",
    "KvstrataTrtllmWorker",
    "KvstrataTrtllmError",
    "describe_model",
    "pool_layer_views",
    "SchedulerOutput",
]

BLOCK_NONE = 0xFFFFFFFF  # KVS_BLOCK_NONE: a block TensorRT-LLM holds no page for (-1)
DEFAULT_CHUNK_TOKENS = 256
DEFAULT_DRAM_CAPACITY = "4GiB"
DEFAULT_TOKENS_PER_BLOCK = 32  # KvCacheConfig.tokens_per_block's default

_DTYPES = {
    "float16": _abi.DTYPE_FP16, "half": _abi.DTYPE_FP16, "fp16": _abi.DTYPE_FP16,
    "bfloat16": _abi.DTYPE_BF16, "bf16": _abi.DTYPE_BF16,
    "float32": _abi.DTYPE_FP32, "float": _abi.DTYPE_FP32, "fp32": _abi.DTYPE_FP32,
    "fp8": _abi.DTYPE_FP8_E4M3, "float8_e4m3fn": _abi.DTYPE_FP8_E4M3,
}
_TORCH_DTYPES = {"float16": {_abi.DTYPE_FP16}, "bfloat16": {_abi.DTYPE_BF16},
                 "float32": {_abi.DTYPE_FP32}, "float8_e4m3fn": {_abi.DTYPE_FP8_E4M3},
                 "uint8": {_abi.DTYPE_FP8_E4M3}, "int8": {_abi.DTYPE_FP8_E4M3}}


class KvstrataTrtllmError(RuntimeError):
    """A configuration kvstrata cannot serve, or a load that failed (TensorRT-LLM has no way to
    recompute the blocks of a failed load)."""


# --- the model ------------------------------------------------------------------------------------------


def _get(obj, name, default=None):
    if obj is None:
        return default
    if isinstance(obj, dict):
        return obj.get(name, default)
    return getattr(obj, name, default)


def _hf_config(model):
    """The model folder's config.json as a dict, or {} (a hub name, or no file)."""
    try:
        path = os.path.join(os.fspath(model), "config.json")
    except TypeError:
        return {}
    if not os.path.isfile(path):
        return {}
    with open(path) as f:
        cfg = json.load(f)
    return cfg.get("text_config", cfg) if isinstance(cfg.get("text_config"), dict) else cfg


def _env_int(name):
    v = os.environ.get(name)
    return int(v) if v not in (None, "") else None


def _rank():
    try:
        from tensorrt_llm._utils import mpi_rank

        return int(mpi_rank())
    except Exception:  # not under TensorRT-LLM: the launcher's variables, else 0
        for name in ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID", "RANK"):
            if os.environ.get(name, "").isdigit():
                return int(os.environ[name])
        return 0


def describe_model(llm_args, scheduler=True, tp_rank=None):
    """The kvs_model_desc fields (a dict) for TensorRT-LLM's arguments: the model's config.json (its
    folder is llm_args.model) gives layers, KV heads, head size and dtype; KVSTRATA_N_LAYERS,
    KVSTRATA_N_KV_HEADS, KVSTRATA_HEAD_DIM and KVSTRATA_DTYPE override them. The KV heads are per
    rank as TensorRT-LLM splits them (rounded up)."""
    kvc = _get(llm_args, "kv_cache_config")
    tp = int(_get(llm_args, "tensor_parallel_size", 1) or 1)
    pp = int(_get(llm_args, "pipeline_parallel_size", 1) or 1)
    cp = int(_get(llm_args, "context_parallel_size", 1) or 1)
    if pp > 1 or cp > 1:
        raise KvstrataTrtllmError(
            "kvstrata: pipeline or context parallelism splits a request's KV across ranks in a way "
            "kvstrata's keys do not describe (TensorRT-LLM's connector refuses pipeline parallelism "
            "too); run with tensor parallelism only")
    if _get(llm_args, "enable_attention_dp", False):
        tp = 1  # every rank holds all heads of its own requests
    cfg = _hf_config(_get(llm_args, "model"))
    is_mla = cfg.get("kv_lora_rank") is not None
    n_layers = _env_int("KVSTRATA_N_LAYERS") or cfg.get("num_hidden_layers")
    if is_mla:
        heads = 1
        head_dim = int(cfg["kv_lora_rank"]) + int(cfg.get("qk_rope_head_dim") or 0)
    else:
        heads = _env_int("KVSTRATA_N_KV_HEADS") or cfg.get("num_key_value_heads") or \
            cfg.get("num_attention_heads")
        head_dim = _env_int("KVSTRATA_HEAD_DIM") or cfg.get("head_dim")
        if head_dim is None and cfg.get("hidden_size") and cfg.get("num_attention_heads"):
            head_dim = int(cfg["hidden_size"]) // int(cfg["num_attention_heads"])
        if heads is not None and not _env_int("KVSTRATA_N_KV_HEADS"):
            heads = (int(heads) + tp - 1) // tp
    missing = [n for n, v in (("n_layers", n_layers), ("n_kv_heads", heads),
                              ("head_dim", head_dim)) if v is None]
    if missing:
        raise KvstrataTrtllmError(
            f"kvstrata: the model's {', '.join(missing)} cannot be read (no config.json in "
            f"{_get(llm_args, 'model')!r}); set KVSTRATA_N_LAYERS, KVSTRATA_N_KV_HEADS and "
            "KVSTRATA_HEAD_DIM")
    dtype_name = os.environ.get("KVSTRATA_DTYPE") or str(_get(kvc, "dtype", "auto") or "auto")
    if dtype_name == "auto":
        dtype_name = str(cfg.get("torch_dtype") or cfg.get("dtype") or "float16")
    dtype_name = dtype_name.lower().replace("torch.", "")
    if dtype_name not in _DTYPES:
        raise KvstrataTrtllmError(f"kvstrata: KV cache dtype {dtype_name!r} is not one kvstrata "
                                  "stores (fp16, bf16, fp32, fp8)")
    block_tokens = int(_get(kvc, "tokens_per_block", None) or DEFAULT_TOKENS_PER_BLOCK)
    salt = os.environ.get("KVSTRATA_SALT") or None
    return {
        "model_id": str(_get(llm_args, "model", "") or ""),
        "dtype": _DTYPES[dtype_name],
        "n_layers": int(n_layers),
        "n_kv_heads": int(heads),
        "head_dim": int(head_dim),
        "block_tokens": block_tokens,
        "is_mla": is_mla,
        "tp_rank": 0 if scheduler or is_mla else (_rank() if tp_rank is None else int(tp_rank)),
        "tp_size": tp,
        "salt": salt,
        "vocab_size": int(cfg.get("vocab_size") or 0),
    }


def _config_path(block_tokens):
    """KVSTRATA_CONFIG, else a YAML written to a temporary folder (returned second, to remove)."""
    path = os.environ.get("KVSTRATA_CONFIG")
    if path:
        path = os.path.abspath(os.path.expanduser(path))
        if not os.path.isfile(path):
            raise KvstrataTrtllmError(f"kvstrata: KVSTRATA_CONFIG names {path}, which is not a file")
        return path, None
    shm = os.environ.get("KVSTRATA_SHM_NAME") or f"kvstrata-trtllm-{os.getuid()}"
    capacity = os.environ.get("KVSTRATA_DRAM_CAPACITY") or DEFAULT_DRAM_CAPACITY
    chunk = block_tokens * max(1, DEFAULT_CHUNK_TOKENS // block_tokens)
    tmp = tempfile.mkdtemp(prefix="kvstrata-trtllm-")
    path = os.path.join(tmp, "kvstrata.yaml")
    with open(path, "w") as f:
        f.write(f"# written by kvstrata.trtllm: one DRAM tier shared by TensorRT-LLM's ranks\n"
                f"version: 1\nchunk_tokens: {chunk}\ntiers:\n  - name: dram\n    type: dram\n"
                f"    capacity: {capacity}\n    options:\n      shm_name: {shm}\n")
    return path, tmp


# --- the pool -------------------------------------------------------------------------------------------


def pool_layer_views(pool, desc, kv_layout="HND"):
    """kvs_layer_views over TensorRT-LLM's primary pool: one tensor for every layer,
    [blocks, layers, kv_factor, heads * tokens_per_block * head_dim] (kv_factor 2: K then V; 1 for
    MLA), block-major. Inside a layer's K (or V) of a block the elements are [heads, tokens, head_dim]
    for TensorRT-LLM's attention kernels (HND); kv_layout "NHD" reads [tokens, heads, head_dim]
    (the FlashInfer and vanilla backends' view of the same bytes). Strides come from the tensor."""
    shape = tuple(int(s) for s in pool.shape)
    stride = tuple(int(s) for s in pool.stride())
    where = f"kvstrata: TensorRT-LLM's KV cache pool of shape {shape} and strides {stride}"
    if len(shape) != 4:
        raise KvstrataTrtllmError(f"{where}: expected [blocks, layers, kv_factor, block_size]")
    dt = str(pool.dtype).replace("torch.", "")
    e = int(pool.element_size())
    if desc["dtype"] not in _TORCH_DTYPES.get(dt, set()) or e != _abi.DTYPE_BYTES[desc["dtype"]]:
        raise KvstrataTrtllmError(f"{where}: its dtype {dt} disagrees with the KV cache dtype "
                                  f"{_abi.DTYPE_NAMES[desc['dtype']]} of the model description")
    n_blocks, n_layers, kv_factor, block_size = shape
    heads, hd, tokens = desc["n_kv_heads"], desc["head_dim"], desc["block_tokens"]
    want_kv = 1 if desc["is_mla"] else 2
    if n_layers != desc["n_layers"] or kv_factor != want_kv or block_size != heads * tokens * hd:
        raise KvstrataTrtllmError(
            f"{where}: the model description wants [blocks, {desc['n_layers']}, {want_kv}, "
            f"{heads * tokens * hd}] ({heads} KV heads x {tokens} tokens x {hd})")
    if stride[3] != 1:
        raise KvstrataTrtllmError(f"{where}: a block's elements are not contiguous")
    if kv_layout == "HND":
        token_stride, head_stride = hd * e, tokens * hd * e
    elif kv_layout == "NHD":
        token_stride, head_stride = heads * hd * e, hd * e
    else:
        raise KvstrataTrtllmError(f"kvstrata: kv_layout {kv_layout!r} is not HND or NHD")
    cuda = pool.device.type == "cuda"
    base = int(pool.data_ptr())
    views = []
    for layer in range(n_layers):
        k = base + layer * stride[1] * e
        views.append(_abi.LayerView(
            struct_size=_abi.LAYER_VIEW_SIZE_1_0,
            device_kind=_abi.DEVICE_CUDA if cuda else _abi.DEVICE_HOST,
            device_index=int(pool.device.index or 0) if cuda else 0,
            n_blocks=n_blocks, k_base=k,
            v_base=None if desc["is_mla"] else k + stride[2] * e,
            block_stride=stride[0] * e, token_stride=token_stride, head_stride=head_stride))
    return views


def _block_ids(ids):
    """TensorRT-LLM's block ids as the library's: -1 (a block with no page, BAD_PAGE_INDEX: a
    sliding window's blocks behind it) becomes KVS_BLOCK_NONE, so no chunk over it is saved and no
    load lands in it."""
    return array.array("I", (BLOCK_NONE if b < 0 else b for b in ids))


# --- the scheduler (rank 0) -----------------------------------------------------------------------------


def _shutdown(side):
    """Close a scheduler's or worker's handle and remove the configuration it wrote."""
    if side._handle is not None:
        side._handle.close()
        side._handle = None
    if side._tmpdir:
        shutil.rmtree(side._tmpdir, ignore_errors=True)
        side._tmpdir = None


class _Req:
    __slots__ = ("tokens", "table", "sent_tokens", "sent_blocks", "offered", "load_async",
                 "external", "looked_up", "lookup_computed", "salt", "bypass")

    def __init__(self):
        self.tokens = array.array("i")
        self.table = array.array("I")
        self.sent_tokens = 0  # of tokens, what the library holds
        self.sent_blocks = 0  # of table, what the library holds
        self.offered = 0
        self.load_async = False
        self.external = 0  # tokens loaded for it that the next step's computed_position leaves out
        self.looked_up = False
        self.lookup_computed = 0
        self.salt = None  # the cache_salt the library keyed the request with ("": none)
        self.bypass = False  # a request the library must not see (its salt could not be keyed)


class KvstrataTrtllmScheduler(KvCacheConnectorScheduler):
    """TensorRT-LLM's connector scheduler over a kvstrata scheduler handle. Each request's tokens and
    block table arrive as deltas (RequestData.new_tokens, new_block_ids) and go to the library as
    deltas (build_meta_update, ABI 1.10): a step costs what changed."""

    def __init__(self, llm_args):
        super().__init__(llm_args)
        _abi.require_minor(10, "KvstrataTrtllmScheduler")
        self._desc = describe_model(llm_args, scheduler=True)
        self._config, self._tmpdir = _config_path(self._desc["block_tokens"])
        self._handle = _abi.Handle(_abi.ROLE_SCHEDULER, self._desc, self._config)
        self._requests = {}

    def _key_salt(self, rid, st, salt):
        """Key the request with its cache_salt before the library first sees it, so requests of
        different salts never share a chunk (TensorRT-LLM's RequestData asks connectors that key
        by tokens to mix it in). 0 when the request must bypass the connector."""
        salt = salt or ""
        if st.salt is not None:
            if st.salt != salt and not st.bypass:
                _log.error("kvstrata: request %s changed cache_salt after it was keyed; it bypasses "
                           "the connector from now on", rid)
                st.bypass = True
            return not st.bypass
        st.salt = salt
        if salt:
            try:
                self._handle.request_key_input(rid, 0, b"trtllm-cache-salt\0" + salt.encode())
            except _abi.KvsError as e:
                _log.error("kvstrata: request %s: its cache_salt cannot be keyed (%s); it bypasses "
                           "the connector", rid, e)
                st.bypass = True
        return not st.bypass

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        rid = str(request.request_id)
        st = self._requests.get(rid) or _Req()
        self._requests[rid] = st
        if not self._key_salt(rid, st, getattr(request, "cache_salt", None)):
            return 0, False
        st.tokens = array.array("i", request.get_tokens(0))
        res = self._handle.lookup(rid, st.tokens, int(num_computed_tokens))
        st.lookup_computed = int(num_computed_tokens)
        st.sent_tokens = len(st.tokens)  # a lookup gives the library the request's tokens
        st.looked_up = True
        # TensorRT-LLM has no "ask again": a lookup still waiting on a remote tier is a miss now
        hit = 0 if res.unknown_yet else int(res.hit_tokens)
        st.offered = hit
        st.load_async = bool(res.load_async and hit > 0)
        st.external = 0
        return hit, st.load_async

    def update_state_after_alloc(self, request, block_ids):
        rid = str(request.request_id)
        st = self._requests.get(rid)
        if st is None:
            st = self._requests[rid] = _Req()
        st.table = _block_ids(block_ids)
        st.sent_blocks = len(st.table)
        if not st.looked_up:
            return
        n = st.offered
        honoured = getattr(request, "py_num_connector_matched_tokens", None)
        if not st.load_async and isinstance(honoured, int) and 0 <= honoured < n:
            # The runtime took less than the offer (0: none): the rest is computed, so only the
            # part taken is loaded, and 0 cancels the load. An asynchronous load always runs whole:
            # TensorRT-LLM parks the request until get_finished reports it, whatever it took.
            n = honoured
        start = st.lookup_computed
        taken = n  # what TensorRT-LLM counts as loaded (computed_position leaves it out)
        if n:
            n = self._past_window(rid, st, start, n)
        try:
            self._handle.on_alloc(rid, st.table, n)
        except _abi.NotFound:
            if n:
                raise
        st.external = 0 if st.load_async else taken
        st.looked_up = False

    def _past_window(self, rid, st, start, n):
        """The tokens to load of an offer of n from `start` whose first blocks are -1 (a sliding
        window's blocks behind it: their KV is never read, and no load may land in them). The load
        starts at the first block after them, with the lookup made again from there (the same
        chunks, still pinned by the first one): where that is inside a chunk, the chunk is read and
        only its tokens from there on land, as for a load after blocks the engine already holds.

        Never raises: this runs inside TensorRT-LLM's scheduler, and it has already counted the
        offer as computed (its connector interface has no way to take an offer back), so the load
        goes ahead with what is still stored, and what is not is logged."""
        bt = self._desc["block_tokens"]
        end = start + n
        table = st.table
        last_none = -1
        for i in range(start // bt, min(len(table), (end - 1) // bt + 1)):
            if table[i] == BLOCK_NONE:
                last_none = i
        if last_none < 0:
            return n
        first = max(start, (last_none + 1) * bt)
        if first >= end:
            return 0  # every block of the offer is behind the window: nothing to load
        try:
            res = self._handle.lookup(rid, st.tokens, first)
            found = 0 if res.unknown_yet else min(int(res.hit_tokens), end - first)
        except Exception as e:  # noqa: BLE001 - nothing may escape into the scheduler
            _log.error("kvstrata: request %s: the lookup from token %d past its sliding window "
                       "failed (%s): nothing is loaded", rid, first, e)
            return 0
        if found < end - first:
            _log.error("kvstrata: request %s: of tokens [%d, %d) offered to TensorRT-LLM, those "
                       "from %d are no longer stored; their blocks keep the bytes they held (its "
                       "interface cannot take an offer back)", rid, first, end, first + found)
        return found

    def build_connector_meta(self, scheduler_output):
        updates = []
        for rd in scheduler_output.new_requests:
            # First scheduled, or again after TensorRT-LLM dropped its allocation: whole lists.
            rid = str(rd.request_id)
            st = self._requests.get(rid)
            if st is None:
                st = self._requests[rid] = _Req()
            if not self._key_salt(rid, st, getattr(rd, "cache_salt", None)):
                continue
            st.tokens = array.array("i", rd.new_tokens)
            st.table = _block_ids(rd.new_block_ids)
            st.sent_tokens = st.sent_blocks = 0
            # computed_position leaves out the tokens a synchronous load brings in this step
            n_computed = int(rd.computed_position) + st.external
            st.external = 0
            updates.append(self._update(rid, st, n_computed, rd.num_scheduled_tokens))
        for rd in scheduler_output.cached_requests:
            rid = str(rd.request_id)
            st = self._requests.get(rid)
            if st is None or st.bypass:
                continue  # never seen whole (what came before is unknown), or bypassing
            if rd.new_tokens:
                st.tokens.extend(rd.new_tokens)
            if rd.new_block_ids:
                st.table.extend(_block_ids(rd.new_block_ids))
            updates.append(self._update(rid, st, int(rd.computed_position),
                                        rd.num_scheduled_tokens))
        try:
            return self._handle.build_meta_update(updates)
        except Exception:
            for u in updates:  # what the library holds is unknown now: next time, whole lists
                st = self._requests.get(u.req_id)
                if st is not None:
                    st.sent_tokens = st.sent_blocks = 0
            raise

    @staticmethod
    def _update(rid, st, n_computed, n_scheduled):
        n_tokens = len(st.tokens)
        n_computed = max(0, min(int(n_computed), n_tokens))
        n_scheduled = max(0, min(int(n_scheduled), n_tokens - n_computed))
        sent_t = min(st.sent_tokens, n_tokens)
        sent_b = min(st.sent_blocks, len(st.table))
        u = _abi.StepUpdate(rid, sent_t, st.tokens[sent_t:], sent_b, st.table[sent_b:],
                            n_computed, n_scheduled)
        st.sent_tokens, st.sent_blocks = n_tokens, len(st.table)
        return u

    def request_finished(self, request, cache_block_ids):
        """True when kvstrata still saves from the request's pages: TensorRT-LLM keeps them until a
        worker's get_finished reports the request."""
        rid = str(request.request_id)
        self._requests.pop(rid, None)
        try:
            return self._handle.request_finished(rid)
        except _abi.NotFound:
            return False  # the library never saw it

    def shutdown(self):
        _shutdown(self)


# --- the worker (every rank) ----------------------------------------------------------------------------


class KvstrataTrtllmWorker(KvCacheConnectorWorker):
    """TensorRT-LLM's connector worker over a kvstrata worker handle: the primary pool as one layer
    view per layer, the bound metadata's loads before the layers read them and saves after they are
    written, and get_finished's two lists."""

    def __init__(self, llm_args):
        super().__init__(llm_args)
        _abi.require_minor(10, "KvstrataTrtllmWorker")
        self._desc = describe_model(llm_args, scheduler=False)
        self._config, self._tmpdir = _config_path(self._desc["block_tokens"])
        self._handle = _abi.Handle(_abi.ROLE_WORKER, self._desc, self._config)
        self._kv_layout = os.environ.get("KVSTRATA_KV_LAYOUT", "HND").upper()
        self._on_load_error = os.environ.get("KVSTRATA_LOAD_ERRORS", "raise").lower()
        self._pool = None
        self._n_layers = 0
        self._cuda = False
        self._bound = self._started = False
        # get_finished may name a request only after TensorRT-LLM passed it in
        self._saving, self._loading = set(), set()
        self._saved, self._loaded = set(), set()
        self._failed = set()  # async loads that ended with failed blocks: never reported loaded
        self._errors_seen = set()  # load_error_blocks already reported since the last bind
        # failed blocks seen at a step's end while async loads were outstanding: they may be an
        # async load's, which get_finished then reports in receiving
        self._async_suspect = set()

    def register_kv_caches(self, kv_cache_tensor):
        views = pool_layer_views(kv_cache_tensor, self._desc, self._kv_layout)
        self._handle.register_kv(views)
        self._pool = kv_cache_tensor  # the pages must outlive the handle
        self._n_layers = len(views)
        self._cuda = views[0].device_kind == _abi.DEVICE_CUDA

    def bind_connector_meta(self, metadata):
        super().bind_connector_meta(metadata)
        if self._pool is None or metadata is None:
            return
        # a step still open (no forward pass ran) is closed by the library here
        self._handle.bind_meta(bytes(metadata))
        self._bound, self._started = True, False
        self._errors_seen = set()  # the library starts the step's error blocks afresh

    def _start(self, stream):
        if self._started:
            return
        if self._cuda and stream is not None:
            self._handle.set_stream(int(getattr(stream, "cuda_stream", 0) or 0))
        self._handle.start_load()
        self._started = True

    def start_load_kv(self, stream):
        # TensorRT-LLM calls this every iteration; only a freshly bound step has work
        if self._bound:
            self._start(stream)

    def wait_for_layer_load(self, layer_idx, stream):
        if self._bound and 0 <= layer_idx < self._n_layers:
            self._start(stream)
            self._handle.wait_layer_load(layer_idx)

    def save_kv_layer(self, layer_idx, stream):
        if self._bound and 0 <= layer_idx < self._n_layers:
            self._start(stream)
            self._handle.save_layer(layer_idx)

    def wait_for_save(self, stream):
        if not self._bound:
            return
        self._start(stream)
        self._handle.wait_save()
        self._bound = False
        bad = self._new_load_errors()
        if self._loading:
            self._async_suspect |= bad
        self._report_load_errors(bad)

    def _new_load_errors(self):
        """The error blocks the library lists that were not reported before (it keeps them until
        the next bind, and adds an async load's blocks when get_finished reports the load)."""
        bad = set(self._handle.load_error_blocks()) - self._errors_seen
        self._errors_seen |= bad
        return bad

    def _report_load_errors(self, bad, requests=()):
        if not bad:
            return
        text = (f"kvstrata: the loads of {len(bad)} blocks failed (evicted or corrupt chunks; "
                f"blocks {sorted(bad)[:8]}); TensorRT-LLM has no way to recompute them")
        if requests:
            text += (f"; the asynchronous loads of requests {sorted(requests)[:8]} ended with "
                     "them and are never reported as loaded")
        if self._on_load_error == "warn":
            _log.error("%s: the requests holding them continue on wrong KV", text)
            return
        raise KvstrataTrtllmError(text)

    def get_finished(self, finished_gen_req_ids, started_loading_req_ids):
        """(saved, loaded): the requests whose async saves and async loads ended, each once and
        only after TensorRT-LLM passed it in. An async load that ended with failed blocks is not a
        load TensorRT-LLM may resume on: with KVSTRATA_LOAD_ERRORS=raise (the default) it raises,
        and the requests it ended with are never reported loaded, by this call or a later one
        (the library does not say which of the requests ending together owns the failed blocks, so
        none of them is); with warn they are reported, as the warning says."""
        self._saving.update(int(r) for r in finished_gen_req_ids)
        self._loading.update(int(r) for r in started_loading_req_ids)
        bad, failed = set(), set()
        if self._pool is not None:
            sending, receiving = self._handle.get_finished()
            self._saved.update(int(r) for r in sending)
            receiving = {int(r) for r in receiving}
            bad = self._new_load_errors()
            if receiving and (bad or self._async_suspect) and self._on_load_error != "warn":
                failed = receiving
                self._failed |= failed
                self._async_suspect.clear()
            else:
                self._loaded |= receiving
        # a failed load's request stays parked in TensorRT-LLM: nothing here names it again
        dropped = self._loading & self._failed
        self._loading -= dropped
        self._failed -= dropped
        # raised before anything is taken out: what ended well is reported by the next call
        self._report_load_errors(bad, failed)
        saved = sorted(self._saved & self._saving)
        loaded = sorted(self._loaded & self._loading)
        self._saving.difference_update(saved)
        self._saved.difference_update(saved)
        self._loading.difference_update(loaded)
        self._loaded.difference_update(loaded)
        return saved, loaded

    def shutdown(self):
        _shutdown(self)
