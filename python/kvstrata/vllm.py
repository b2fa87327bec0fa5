"""KvstrataConnector: vLLM's KV connector v1 over libkvstrata.

Enable it with
  --kv-transfer-config '{"kv_connector":"KvstrataConnector","kv_connector_module_path":"kvstrata.vllm",
    "kv_role":"kv_both","kv_load_failure_policy":"recompute",
    "kv_connector_extra_config":{"config":"deploy.yaml"}}'

vLLM builds one instance with role SCHEDULER in its engine-core process and one with role WORKER in
each worker process (one per tensor-parallel rank). Each opens its own libkvstrata handle in __init__;
importing this module and calling its class methods (what vLLM's front-end process does) never loads
the library. docs/vllm.md describes the configuration, the metrics and the process layout.
"""

import array
import atexit
import logging
import os
import re
import shutil
import tempfile
import time
import weakref

from kvstrata import _abi

try:  # the real vLLM classes when vLLM is installed
    from vllm.distributed.kv_transfer.kv_connector.v1.base import (
        KVConnectorBase_V1,
        KVConnectorMetadata,
        KVConnectorRole,
        SupportsHMA,
    )

    HAVE_VLLM = True
except ImportError:
    from kvstrata._vllm_standin import (
        KVConnectorBase_V1,
        KVConnectorMetadata,
        KVConnectorRole,
        SupportsHMA,
    )

    HAVE_VLLM = False

from kvstrata.vllm_metrics import KvstrataConnectorStats, KvstrataPromMetrics, stats_delta

_log = logging.getLogger("kvstrata")

__all__ = [
    "KvstrataConnector",
    "KvstrataConnectorMetadata",
    "KvstrataConnectorStats",
    "KvstrataPromMetrics",
    "KvstrataConfigError",
    "ModelDescription",
    "describe_model",
    "layer_view",
]

DEFAULT_DRAM_CAPACITY = "4GiB"
MAX_TENANT_LABELS = 64  # tenants counted apart over the process's life; the rest count as "other"
DEFAULT_CHUNK_TOKENS = 256
# A consumer waits this long (kv_connector_extra_config 'handoff_wait_ms') for the chunks a
# producer said it stored before it takes the hit it has (the rest is recomputed).
DEFAULT_HANDOFF_WAIT_MS = 10000
# The key of request_finished's kv_transfer_params a producer fills: the tokens (whole chunks) its
# saves store for the request. vLLM hands the params to the decode request on the consumer.
STORED_TOKENS_PARAM = "kvstrata_stored_tokens"

_TRANSFER_ROLES = {None: _abi.TRANSFER_BOTH, "kv_both": _abi.TRANSFER_BOTH,
                   "kv_producer": _abi.TRANSFER_PRODUCER, "kv_consumer": _abi.TRANSFER_CONSUMER}


def transfer_role(kv_transfer_config):
    """The library's transfer role for vLLM's kv_role (kv_producer, kv_consumer, kv_both)."""
    kv_role = getattr(kv_transfer_config, "kv_role", None)
    try:
        return _TRANSFER_ROLES[kv_role]
    except KeyError:
        raise KvstrataConfigError(
            f"kvstrata: kv_role {kv_role!r} is not kv_producer, kv_consumer or kv_both") from None


class KvstrataConfigError(ValueError):
    """The vLLM configuration, the KV cache tensors or the extra config do not fit kvstrata."""


# --- the model, as both roles describe it ----------------------------------------------------------


class ModelDescription:
    """The kvs_model_desc fields. Built from vllm_config alone (and kv_cache_config when vLLM passes
    it), so the scheduler and every worker derive the same fingerprint inputs."""

    FIELDS = ("model_id", "dtype", "n_layers", "n_kv_heads", "head_dim", "block_tokens", "is_mla",
              "tp_rank", "tp_size", "salt", "vocab_size")

    def __init__(self, **kw):
        for f in self.FIELDS:
            setattr(self, f, kw.get(f))

    def as_dict(self):
        return {f: getattr(self, f) for f in self.FIELDS}

    def __repr__(self):
        return "ModelDescription(" + ", ".join(f"{f}={getattr(self, f)!r}" for f in self.FIELDS) + ")"


_DTYPE_BY_NAME = {
    "float16": _abi.DTYPE_FP16, "half": _abi.DTYPE_FP16, "fp16": _abi.DTYPE_FP16,
    "bfloat16": _abi.DTYPE_BF16, "bf16": _abi.DTYPE_BF16,
    "float32": _abi.DTYPE_FP32, "float": _abi.DTYPE_FP32, "fp32": _abi.DTYPE_FP32,
    "fp8": _abi.DTYPE_FP8_E4M3, "fp8_e4m3": _abi.DTYPE_FP8_E4M3,
    "float8_e4m3fn": _abi.DTYPE_FP8_E4M3, "fp8_e5m2": _abi.DTYPE_FP8_E5M2,
    "float8_e5m2": _abi.DTYPE_FP8_E5M2,
}


def _dtype_name(dtype):
    s = str(dtype)
    return s[len("torch."):] if s.startswith("torch.") else s


def _kvs_dtype(cache_dtype, model_dtype):
    name = _dtype_name(cache_dtype or "auto")
    if name == "auto":
        name = _dtype_name(model_dtype)
    code = _DTYPE_BY_NAME.get(name)
    if code is None:
        raise KvstrataConfigError(
            f"kvstrata: KV cache dtype {name!r} (cache_dtype {cache_dtype!r}, model dtype "
            f"{_dtype_name(model_dtype)!r}) is not one kvstrata stores: fp16, bf16, fp32, fp8_e4m3, "
            "fp8_e5m2")
    return code


def _role_is_scheduler(role):
    if role == KVConnectorRole.SCHEDULER:
        return True
    return getattr(role, "name", None) == "SCHEDULER"


def _tp_rank(vllm_config, tp_size):
    """This worker's tensor-parallel rank: vLLM's process group when it is up, else the parallel
    config's global rank modulo the TP size (vLLM orders ranks TP-fastest)."""
    if HAVE_VLLM:
        try:
            from vllm.distributed.parallel_state import get_tensor_model_parallel_rank

            return int(get_tensor_model_parallel_rank())
        except Exception:  # the group is not initialised (tests, some executors)
            pass
    rank = int(getattr(vllm_config.parallel_config, "rank", 0) or 0)
    return rank % tp_size


BLOCK_NONE = 0xFFFFFFFF  # KVS_BLOCK_NONE: a block the engine holds no page for


class KVGroup:
    """One KV cache group as kvstrata stores it: its layers and, for a sliding-window group, its
    window (tokens) and the tokens vLLM retains below it."""

    def __init__(self, index, layer_names, block_tokens, window=None, retained=0):
        self.index = index
        self.layer_names = list(layer_names)
        self.block_tokens = block_tokens
        self.window = window
        self.retained = retained

    def first_held(self, n_computed):
        """The first token whose block vLLM still holds once n_computed tokens are computed (0 for
        a full-attention group): the blocks before it are the null block."""
        if not self.window:
            return 0
        skipped = max(0, int(n_computed) - self.window + 1 - self.retained)
        return skipped // self.block_tokens * self.block_tokens


def _group_kind(spec):
    """(window, retained) of a group's spec: window None for full attention. Refuses what kvstrata
    does not store."""
    kind = type(spec).__name__
    if "Mamba" in kind or "Linear" in kind or getattr(spec, "num_kv_heads", None) is None:
        raise KvstrataConfigError(
            f"kvstrata: this model's KV cache holds {kind} state (Mamba or linear attention), "
            "not attention KV; kvstrata stores attention KV only, so it refuses the model "
            "rather than restore recurrent state it does not describe")
    if "ChunkedLocal" in kind or "RSWA" in kind or "SinkFull" in kind:
        raise KvstrataConfigError(
            f"kvstrata: this model has a {kind} KV cache group, whose pages vLLM frees in a way "
            "kvstrata does not follow; it stores full-attention and sliding-window groups only")
    if "SlidingWindow" in kind:
        return int(spec.sliding_window), int(getattr(spec, "extra_retained_tokens", 0) or 0)
    return None, 0


def kv_groups(vllm_config, kv_cache_config=None):
    """The KV cache groups kvstrata stores (one handle each), or one group of every layer when vLLM
    passes no kv_cache_config."""
    groups = getattr(kv_cache_config, "kv_cache_groups", None) if kv_cache_config else None
    if not groups:
        return [KVGroup(0, [], int(vllm_config.cache_config.block_size))]
    out = []
    for i, g in enumerate(groups):
        window, retained = _group_kind(g.kv_cache_spec)
        bt = getattr(g.kv_cache_spec, "block_size", None) or vllm_config.cache_config.block_size
        out.append(KVGroup(i, g.layer_names, int(bt), window, retained))
    return out


def describe_model(vllm_config, kv_cache_config=None, scheduler=True, group=0):
    """The model description of KV cache group `group` for a handle of this role: every field but
    tp_rank is the same in every process of one vLLM instance. A model of several groups (hybrid:
    full-attention and sliding-window layers) has one description per group, its salt naming the
    group and its window so that every group's chunks have keys of their own."""
    mc = vllm_config.model_config
    cc = vllm_config.cache_config
    pc = vllm_config.parallel_config
    tp_size = int(getattr(pc, "tensor_parallel_size", 1) or 1)
    for name, what in (("pipeline_parallel_size", "pipeline parallelism"),
                       ("decode_context_parallel_size", "decode context parallelism"),
                       ("prefill_context_parallel_size", "prefill context parallelism")):
        n = int(getattr(pc, name, 1) or 1)
        if n > 1:
            raise KvstrataConfigError(
                f"kvstrata: {what} ({name} {n}) splits a request's KV across ranks in a way "
                "kvstrata's keys do not describe; run with tensor parallelism only")
    is_mla = bool(getattr(mc, "use_mla", False))
    n_layers = heads = head_dim = block_tokens = None
    groups = getattr(kv_cache_config, "kv_cache_groups", None) if kv_cache_config else None
    window = None
    if groups is not None:
        for g in groups:  # every group is refused or stored: none is silently left out
            _group_kind(g.kv_cache_spec)
        spec = groups[group].kv_cache_spec
        window, retained = _group_kind(spec)
        n_layers = len(groups[group].layer_names)
        heads = getattr(spec, "num_kv_heads", None)
        head_dim = getattr(spec, "head_size", None)
        block_tokens = getattr(spec, "block_size", None)
    if n_layers is None:
        try:
            n_layers = mc.get_num_layers_by_block_type(pc, "attention")
        except Exception:
            n_layers = mc.get_num_layers(pc)
    if heads is None:
        heads = 1 if is_mla else mc.get_num_kv_heads(pc)
    if head_dim is None:
        head_dim = mc.get_head_size()
    if block_tokens is None:
        block_tokens = cc.block_size
    salt_parts = []
    for name in ("revision", "quantization"):
        v = getattr(mc, name, None)
        if v:
            salt_parts.append(f"{name}={v}")
    extra = dict(getattr(vllm_config.kv_transfer_config, "kv_connector_extra_config", None) or {})
    if extra.get("salt"):
        salt_parts.append(f"salt={extra['salt']}")
    if groups is not None and len(groups) > 1:
        salt_parts.append(f"kv_group={group}")
        if window:
            salt_parts.append(f"sliding_window={window}")
    try:
        vocab = int(mc.get_vocab_size())
    except Exception:
        vocab = 0
    return ModelDescription(
        model_id=str(mc.model),
        dtype=_kvs_dtype(getattr(cc, "cache_dtype", "auto"), getattr(mc, "dtype", None)),
        n_layers=int(n_layers),
        n_kv_heads=1 if is_mla else int(heads),
        head_dim=int(head_dim),
        block_tokens=int(block_tokens),
        is_mla=is_mla,
        tp_rank=0 if scheduler or is_mla else _tp_rank(vllm_config, tp_size),
        tp_size=tp_size,
        salt=";".join(salt_parts) or None,
        vocab_size=vocab,
    )


# --- views over vLLM's KV cache tensors -------------------------------------------------------------

_TORCH_DTYPES = {
    "float16": {_abi.DTYPE_FP16}, "bfloat16": {_abi.DTYPE_BF16}, "float32": {_abi.DTYPE_FP32},
    "uint8": {_abi.DTYPE_FP8_E4M3, _abi.DTYPE_FP8_E5M2},
    "int8": {_abi.DTYPE_FP8_E4M3, _abi.DTYPE_FP8_E5M2},
    "float8_e4m3fn": {_abi.DTYPE_FP8_E4M3}, "float8_e5m2": {_abi.DTYPE_FP8_E5M2},
}


def _shape(t):
    return tuple(int(x) for x in t.shape)


def _strides(t):
    return tuple(int(x) for x in t.stride())


def layer_view(name, t, desc):
    """A kvs_layer_view for one layer's KV cache tensor, from data_ptr(), stride() and
    element_size() only. Layouts read (shapes as vLLM's backends give them, any stride order):
      (2, blocks, block, heads, head)      FlashAttention (NHD, or HND strides)
      (blocks, 2, block, heads, head)      FlashInfer
      (blocks, block, head)                MLA (v_base NULL)
      (blocks, heads, block, 2 * head)     packed K/V (V at `head` elements)
    A kernel block smaller than the model's block size is described as one logical block when its
    tokens are contiguous across the kernel blocks of a logical block."""
    shape, stride = _shape(t), _strides(t)
    e = int(t.element_size())
    where = f"kvstrata: layer {name!r}: KV cache tensor of shape {shape} and strides {stride}"
    allowed = _TORCH_DTYPES.get(_dtype_name(t.dtype), set())
    if desc.dtype not in allowed or e != _abi.DTYPE_BYTES[desc.dtype]:
        raise KvstrataConfigError(
            f"{where}: its dtype {_dtype_name(t.dtype)} disagrees with the KV cache dtype "
            f"{_abi.DTYPE_NAMES[desc.dtype]} vLLM's configuration gives")
    hd = desc.head_dim
    base = int(t.data_ptr())
    v_base = None
    if desc.is_mla:
        if len(shape) == 4 and shape[2] == 1:  # (blocks, block, 1, head)
            shape, stride = shape[:2] + shape[3:], stride[:2] + stride[3:]
        if len(shape) != 3 or shape[2] != hd:
            raise KvstrataConfigError(
                f"{where}: an MLA cache is (blocks, block_size, {hd}) and this is not")
        n_blocks, block, heads = shape[0], shape[1], 1
        block_stride, token_stride, head_stride = stride[0], stride[1], hd
        elem_stride = stride[2]
    elif len(shape) == 5:
        flash_attn = shape[0] == 2 and shape[3:] == (desc.n_kv_heads, hd)
        flash_infer = shape[1] == 2 and shape[3:] == (desc.n_kv_heads, hd)
        if flash_attn:  # with 2 blocks both match and are laid out alike: FlashAttention's reading
            kv_dim, block_dim = 0, 1
        elif flash_infer:
            kv_dim, block_dim = 1, 0
        else:
            raise KvstrataConfigError(
                f"{where}: expected (2, blocks, block_size, {desc.n_kv_heads}, {hd}) or (blocks, 2, "
                f"block_size, {desc.n_kv_heads}, {hd}) for {desc.n_kv_heads} KV heads of {hd} "
                "per rank")
        n_blocks, block, heads = shape[block_dim], shape[2], shape[3]
        block_stride, token_stride, head_stride = stride[block_dim], stride[2], stride[3]
        elem_stride = stride[4]
        v_base = base + stride[kv_dim] * e
    elif len(shape) == 4 and shape[3] == 2 * hd:
        if shape[1] != desc.n_kv_heads:
            raise KvstrataConfigError(
                f"{where}: a packed K/V cache (blocks, heads, block_size, 2 * head_size) with "
                f"{shape[1]} heads, but the model has {desc.n_kv_heads} KV heads per rank")
        n_blocks, heads, block = shape[0], shape[1], shape[2]
        block_stride, token_stride, head_stride = stride[0], stride[2], stride[1]
        elem_stride = stride[3]
        v_base = base + hd * e
    else:
        raise KvstrataConfigError(
            f"{where}: matches none of the layouts kvstrata reads (FlashAttention (2, blocks, "
            f"block_size, heads, head_size), FlashInfer (blocks, 2, ...), MLA (blocks, block_size, "
            "head_size), packed K/V (blocks, heads, block_size, 2 * head_size)) for "
            f"{desc.n_kv_heads} KV heads of {hd}")
    if elem_stride != 1:
        raise KvstrataConfigError(f"{where}: the {hd} elements of a head are not contiguous")
    logical = desc.block_tokens
    if block != logical:
        if block > logical or logical % block != 0:
            raise KvstrataConfigError(
                f"{where}: its blocks of {block} tokens do not divide the block size {logical} "
                "vLLM's scheduler uses")
        ratio = logical // block
        if block_stride != block * token_stride or n_blocks % ratio != 0:
            raise KvstrataConfigError(
                f"{where}: kernel blocks of {block} tokens are smaller than the scheduler's blocks "
                f"of {logical}, and the tokens of one scheduler block are not evenly spaced across "
                "its kernel blocks (an HND layout, or FlashInfer's K and V side by side in each "
                "block); use FlashAttention with NHD strides, or kernel blocks as large as the "
                "scheduler's")
        n_blocks //= ratio
        block_stride *= ratio
    dev = t.device
    if dev.type == "cuda":
        kind, index = _abi.DEVICE_CUDA, int(dev.index or 0)
    elif dev.type == "cpu":
        kind, index = _abi.DEVICE_HOST, 0
    else:
        raise KvstrataConfigError(f"{where}: on device {dev}, neither the CPU nor CUDA")
    return _abi.LayerView(struct_size=_abi.ctypes.sizeof(_abi.LayerView), device_kind=kind,
                          device_index=index, n_blocks=n_blocks, k_base=base, v_base=v_base,
                          block_stride=block_stride * e, token_stride=token_stride * e,
                          head_stride=head_stride * e)


# --- metadata, stats, metrics ---------------------------------------------------------------------


class KvstrataConnectorMetadata(KVConnectorMetadata):
    """One step's metadata: the msgpack blob build_meta made (opaque to Python, pickled to the
    workers with the scheduler output)."""

    def __init__(self, blob, req_ids=(), blobs=None, sending_groups=None):
        self.blob = bytes(blob)  # group 0's
        self.blobs = [self.blob] + [bytes(b) for b in blobs[1:]] if blobs else [self.blob]
        self.req_ids = tuple(req_ids)
        # finished requests whose pages some groups' handles keep: {req_id: number of those
        # groups} (the workers report such a request once each of them did)
        self.sending_groups = dict(sending_groups or {})

    def __repr__(self):
        return f"KvstrataConnectorMetadata({len(self.blob)} bytes, {len(self.req_ids)} requests)"


# --- the default configuration ------------------------------------------------------------------------

_SHM_OK = re.compile(r"[^A-Za-z0-9_.-]")
_SIZE_OK = re.compile(r"^[0-9]+(\.[0-9]+)?\s*[A-Za-z]*$")


def default_shm_name(vllm_config):
    """/dev/shm name of the default DRAM tier: from kv_transfer_config.engine_id, which vLLM sets
    once per instance (a uuid unless the user gives one) and hands to every process of it."""
    engine_id = getattr(vllm_config.kv_transfer_config, "engine_id", None)
    if not engine_id:
        raise KvstrataConfigError(
            "kvstrata: kv_transfer_config.engine_id is empty, so the scheduler and the workers "
            "cannot agree on a shared DRAM tier; set engine_id, or kv_connector_extra_config "
            "'shm_name', or give a YAML file as 'config'")
    return ("kvstrata-" + _SHM_OK.sub("_", str(engine_id)))[:200]


def default_config_text(vllm_config, extra, block_tokens):
    """The YAML used when kv_connector_extra_config has no 'config': one DRAM tier shared by the
    instance's processes through POSIX shared memory."""
    shm = str(extra.get("shm_name") or default_shm_name(vllm_config))
    if _SHM_OK.search(shm) or not 1 <= len(shm) <= 200:
        raise KvstrataConfigError(
            f"kvstrata: shm_name {shm!r} must be 1 to 200 characters of A-Z a-z 0-9 _ . -")
    capacity = str(extra.get("dram_capacity", DEFAULT_DRAM_CAPACITY))
    if not _SIZE_OK.match(capacity):
        raise KvstrataConfigError(
            f"kvstrata: dram_capacity {capacity!r} is not a size (e.g. 4GiB, 512MiB)")
    chunk = extra.get("chunk_tokens")
    if chunk is None:
        chunk = block_tokens * max(1, DEFAULT_CHUNK_TOKENS // block_tokens)
    return (f"# written by kvstrata.vllm: one DRAM tier shared by vLLM's processes\n"
            f"version: 1\n"
            f"chunk_tokens: {int(chunk)}\n"
            f"tiers:\n"
            f"  - name: dram\n"
            f"    type: dram\n"
            f"    capacity: {capacity}\n"
            f"    options:\n"
            f"      shm_name: {shm}\n")


# Handles still open at interpreter exit are closed (a shared tier is unlinked by its last user).
_open_connectors = weakref.WeakSet()


@atexit.register
def _close_open_connectors():
    for c in list(_open_connectors):
        try:
            c.shutdown()
        except Exception:
            pass


# --- the connector --------------------------------------------------------------------------------------


_NEVER = 1 << 62  # an n_computed no request reaches


class _SchedRequest:
    __slots__ = ("request", "tokens", "tables", "bypass", "looked_up", "load_async",
                 "async_armed", "keyed", "tenant", "sent", "sent_tables", "load_pending",
                 "prompt_tokens", "handoff_deadline", "group_from", "lookup_computed", "marked",
                 "skip_from")

    def __init__(self, request=None, bypass=None, n_groups=1):
        self.request = request
        self.tokens = array.array("i")
        self.tables = [[] for _ in range(n_groups)]  # block table per KV cache group
        self.sent_tables = [0] * n_groups  # build_meta_update: the library holds tables[g][:n]
        self.marked = [0] * n_groups  # window groups: blocks already given as BLOCK_NONE
        self.group_from = None  # the last lookup: the token each group's load starts at
        self.lookup_computed = 0
        self.bypass = bypass
        self.looked_up = False
        self.load_async = False  # the last lookup's hit loads between steps
        self.async_armed = False  # on_alloc armed that asynchronous load
        self.keyed = False  # its key inputs went to the library
        self.tenant = "-"
        # build_meta_update: the library holds tokens[:sent]
        self.sent = 0
        self.load_pending = False  # on_alloc armed a load no step has carried yet
        self.prompt_tokens = getattr(request, "num_prompt_tokens", None)
        self.skip_from = _NEVER  # build_meta_update: not handed over from this n_computed on
        self.handoff_deadline = None  # consumer: waits for the producer's chunks until then

    @property
    def block_ids(self):  # group 0's table
        return self.tables[0]

    @block_ids.setter
    def block_ids(self, ids):
        self.tables[0] = ids

    @property
    def sent_blocks(self):
        return self.sent_tables[0]

    @sent_blocks.setter
    def sent_blocks(self, n):
        self.sent_tables[0] = n


def _bypass_reason(req):
    """Why a request's KV cannot be keyed by kvstrata (its tokens and key inputs), or None."""
    if getattr(req, "prompt_embeds", None) is not None:
        return "prompt embeddings"
    if getattr(req, "mm_inputs", None) and not getattr(req, "mm_features", None):
        return "multimodal inputs without hashes"
    return None


def _text(v):
    return str(v).encode("utf-8", "surrogatepass")


def key_inputs(req, epoch=None):
    """What besides its tokens a request's KV depends on, as (first token, bytes) pairs for the
    library's request_key_input: the tenant's cache_salt and the LoRA adapter (from token 0), each
    multimodal input's hash at its placeholder's first position (vLLM's own block hashes take the
    same inputs), and the connector's reset epoch. Each part is tagged, so no two kinds collide."""
    out = []
    if epoch:
        out.append((0, b"epoch\0" + epoch))
    salt = getattr(req, "cache_salt", None)
    if salt:
        out.append((0, b"cache_salt\0" + _text(salt)))
    lora = getattr(req, "lora_request", None)
    if lora is not None:
        name = getattr(lora, "lora_name", None) or getattr(lora, "name", None) or ""
        path = getattr(lora, "lora_path", None) or getattr(lora, "path", None) or ""
        out.append((0, b"lora\0" + _text(name) + b"\0" + _text(path)))
    for f in getattr(req, "mm_features", None) or ():
        ident = getattr(f, "identifier", None) or getattr(f, "mm_hash", None)
        pos = getattr(f, "mm_position", None)
        if ident is None or pos is None:
            raise KvstrataConfigError(
                "kvstrata: a multimodal input without an identifier or a position cannot be keyed")
        offset = int(pos.offset)
        out.append((offset, b"mm\0" + _text(ident) + b"\0" + _text(offset)))
    return out


def tenant_label(req):
    """The label a request's tenant is counted under: a short hash of its cache_salt (the salt may
    be a secret), "-" without one."""
    salt = getattr(req, "cache_salt", None)
    if not salt:
        return "-"
    import hashlib

    return hashlib.sha256(_text(salt)).hexdigest()[:12]


def _per_group(block_ids, n_groups):
    """vLLM's block ids per KV cache group (a tuple of lists, or one list for one group) as a list
    of n_groups lists (None: nothing new)."""
    if block_ids is None:
        return None
    if isinstance(block_ids, tuple) or (block_ids and isinstance(block_ids[0], (list, tuple))):
        out = [list(b) for b in block_ids]
    else:
        out = [list(block_ids)]
    if len(out) < n_groups:
        out += [[] for _ in range(n_groups - len(out))]
    return out[:n_groups]


def _group0(block_ids):
    """vLLM passes block ids per KV cache group (a tuple of lists); kvstrata uses the one group."""
    if block_ids is None:
        return None
    if isinstance(block_ids, tuple):
        return list(block_ids[0]) if block_ids else []
    if block_ids and isinstance(block_ids[0], (list, tuple)):
        return list(block_ids[0])
    return list(block_ids)


def _set_tokens(st, source):
    """Bring st.tokens up to `source` (a list-like of every token so far), appending when only new
    tokens came, copying otherwise."""
    n, have = len(source), len(st.tokens)
    if n > have and have and source[have - 1] == st.tokens[have - 1]:
        st.tokens.extend(source[have:])
    elif n != have or (n and source[n - 1] != st.tokens[n - 1]):
        st.tokens = array.array("i", source)
        st.sent = 0  # the library's copy is another list now: hand over the whole one


def _base_takes_kv_cache_config():
    """Whether the base class's constructor has the kv_cache_config parameter (releases before it
    took (vllm_config, role) only)."""
    import inspect

    try:
        params = inspect.signature(KVConnectorBase_V1.__init__).parameters
    except (TypeError, ValueError):
        return True
    return "kv_cache_config" in params or len(params) >= 4 or any(
        p.kind == p.VAR_POSITIONAL for p in params.values())


# SupportsHMA: vLLM keeps its hybrid allocator on for models with several KV cache groups
# (full-attention and sliding-window layers); kvstrata stores each group through a handle of its own.
class KvstrataConnector(KVConnectorBase_V1, SupportsHMA):
    """vLLM KV connector v1 over libkvstrata (docs/vllm.md)."""

    _transfer_role = _abi.TRANSFER_BOTH  # kv_role (set in __init__)
    _handoff_wait_s = DEFAULT_HANDOFF_WAIT_MS / 1000.0
    _chunk_tokens = 0  # the library's, from the first lookup (ABI 1.10)
    _groups = ()  # KVGroup per KV cache group, one handle each (set in __init__)
    _windows = ()
    _handles = ()

    @property
    def _n_groups(self):
        return max(1, len(self._groups))

    def __init__(self, vllm_config, role, kv_cache_config=None):
        if _base_takes_kv_cache_config():
            super().__init__(vllm_config, role, kv_cache_config)
        else:  # vLLM releases whose base class took (vllm_config, role)
            super().__init__(vllm_config, role)
        self._scheduler = _role_is_scheduler(role)
        ktc = vllm_config.kv_transfer_config
        self._extra = dict(getattr(ktc, "kv_connector_extra_config", None) or {})
        self._transfer_role = transfer_role(ktc)
        self._handoff_wait_s = float(self._extra.get("handoff_wait_ms",
                                                     DEFAULT_HANDOFF_WAIT_MS)) / 1000.0
        self._chunk_tokens = 0  # the library's, from the first lookup (ABI 1.10)
        self._groups = kv_groups(vllm_config, kv_cache_config)
        self._models = [describe_model(vllm_config, kv_cache_config, scheduler=self._scheduler,
                                       group=g.index) for g in self._groups]
        self._model = self._models[0]
        self._windows = [g for g in self._groups if g.window]
        self._tmpdir = None
        self._handle = None
        self._handles = []
        self._kept_groups = {}  # scheduler: finished request -> groups whose handle keeps its pages
        self._expect_sending = {}  # worker: request -> groups that report its saves
        self._pending_sending = {}
        self._pending_recving = {}
        # scheduler side
        self._requests = {}
        self._epoch = None  # reset_cache's random value, in every later request's keys
        self._resets = 0
        self._tenants = {}  # tenant label -> lookup counts since the last stats call
        self._tenant_labels = set()  # every label counted so far (at most MAX_TENANT_LABELS)
        # worker side
        self._layer_index = {}
        self._shared_layers = set()
        self._layer_names = []
        self._kv_tensors = None
        self._cuda = False
        self._bound = False
        self._started = False
        self._last_stats = None
        self._tier_names = []
        self._config_path = self._resolve_config()
        try:
            self._open()
        except BaseException:
            for h in self._handles:
                h.close()
            self._handles, self._handle = [], None
            if self._tmpdir:
                shutil.rmtree(self._tmpdir, ignore_errors=True)
            raise

    # -- setup --

    def _resolve_config(self):
        path = self._extra.get("config")
        if path:
            path = os.path.abspath(os.path.expanduser(str(path)))
            if not os.path.isfile(path):
                raise KvstrataConfigError(
                    f"kvstrata: kv_connector_extra_config 'config' names {path}, which is not a "
                    "file")
            return path
        text = default_config_text(self._vllm_config, self._extra, self._model.block_tokens)
        self._tmpdir = tempfile.mkdtemp(prefix="kvstrata-vllm-")
        path = os.path.join(self._tmpdir, "kvstrata.yaml")
        with open(path, "w") as f:
            f.write(text)
        return path

    def _open(self):
        _abi.require_minor(5, "KvstrataConnector")
        role = _abi.ROLE_SCHEDULER if self._scheduler else _abi.ROLE_WORKER
        for model in self._models:  # one handle per KV cache group
            self._handles.append(_abi.Handle(role, model.as_dict(), self._config_path,
                                             transfer_role=self._transfer_role))
        self._handle = self._handles[0]
        self._tier_names = self._handle.tier_names()
        self._key_inputs_supported = (hasattr(self._handle, "request_key_input")
                                      and _abi.has_hook("request_key_input"))
        self._meta_updates = (self._scheduler and hasattr(self._handle, "build_meta_update")
                              and _abi.has_hook("build_meta_update"))
        info = self._handle.info() if hasattr(self._handle, "info") and _abi.has_hook(
            "handle_info") else None
        # without the library's word, decode tokens may be saved: every request goes every step
        self._decode_saves = True if info is None else bool(info["save_decode"])
        _open_connectors.add(self)

    # -- properties and class methods (no library) --

    @property
    def prefer_cross_layer_blocks(self):
        v = self._extra.get("cross_layer_blocks", False)
        return v is True or str(v).lower() in ("1", "true", "yes", "on")

    @property
    def requires_kv_delivery(self):
        # A producer's hand-off must reach its consumer: vLLM recomputes a request preempted while
        # it is pending. Elsewhere a dropped save costs a later miss, never correctness.
        return self._transfer_role == _abi.TRANSFER_PRODUCER

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config):
        return None  # every layout is read through its strides

    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config):
        return True  # the layer hooks must run between the graph's pieces

    @classmethod
    def build_kv_connector_stats(cls, data=None):
        return KvstrataConnectorStats(data=dict(data) if data else {})

    @classmethod
    def build_prom_metrics(cls, vllm_config, metric_types, labelnames, per_engine_labelvalues):
        return KvstrataPromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)

    # -- scheduler side --

    def _track(self, request):
        rid = request.request_id
        st = self._requests.get(rid)
        if st is None:
            st = self._requests[rid] = _SchedRequest(request, _bypass_reason(request), self._n_groups)
            st.tenant = tenant_label(request)
        else:
            st.request = request
        return st

    def _key(self, rid, st, source):
        """Give the library the request's key inputs once, before its keys are first computed. A
        library without request_key_input (ABI < 1.10) cannot key them: such a request bypasses
        the connector rather than share the KV of requests without them."""
        if st.keyed or st.bypass:
            return
        st.keyed = True
        try:
            inputs = key_inputs(source, self._epoch) if source is not None else (
                [(0, b"epoch\0" + self._epoch)] if self._epoch else [])
            if inputs and not self._key_inputs_supported:
                st.bypass = "per-request key inputs (cache_salt, LoRA, multimodal) need ABI 1.10"
                return
            for h in self._handles:
                for first, data in inputs:
                    h.request_key_input(rid, first, data)
        except (KvstrataConfigError, _abi.KvsError) as e:
            # A request whose inputs cannot be keyed (too many images, an input without a hash) is
            # computed without the connector; the engine and the other requests go on.
            st.bypass = f"its key inputs were refused: {e}"
            _log.warning("kvstrata: request %r bypasses the connector: %s", rid, st.bypass)

    def on_new_request(self, request):
        self._track(request)

    def reset_cache(self):
        """vLLM's reset_prefix_cache(reset_connector=True) (a weight update, sleep and wake): every
        chunk stored so far becomes unreachable to this instance's later requests. The epoch, the
        count of resets, enters the keys of every request keyed from now on (instances that reset
        together, once per weight update, agree on it and keep sharing); a request the library
        already keyed with the old epoch (running, preempted or looked up while waiting) bypasses
        the connector from now on, so nothing computed with the old weights is stored under the
        new keys and nothing stored before is loaded. The stored objects age out of the tiers.
        False when the library cannot key requests (ABI < 1.10)."""
        if not self._scheduler:
            return None
        if not self._key_inputs_supported:
            return False
        self._resets += 1
        self._epoch = b"%d" % self._resets
        for st in self._requests.values():
            if (st.keyed or st.looked_up) and not st.bypass:
                st.bypass = "it was keyed before a cache reset"
                st.skip_from = 0
        return True

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        st = self._track(request)
        self._key(request.request_id, st, request)
        if st.bypass:
            return 0, False
        _set_tokens(st, request.all_token_ids)
        if len(self._handles) > 1:
            hit, load_async = self._lookup_groups(request.request_id, st, int(num_computed_tokens))
        else:
            res = self._handle.lookup(request.request_id, st.tokens, num_computed_tokens)
            if res.chunk_tokens:
                self._chunk_tokens = res.chunk_tokens
            hit = None if res.unknown_yet else res.hit_tokens
            load_async = res.load_async
        st.sent = len(st.tokens)  # a lookup gives the library the request's tokens
        st.looked_up = True
        st.async_armed = False
        st.lookup_computed = int(num_computed_tokens)
        if hit is None:
            return None, False
        if self._transfer_role == _abi.TRANSFER_CONSUMER and self._handoff_pending(
                request, st, num_computed_tokens + hit):
            return None, False
        self._count_tenant(st.tenant, hit,
                           max(0, len(st.tokens) - int(num_computed_tokens) - hit))
        st.load_async = bool(load_async and hit > 0)
        return hit, st.load_async

    # A hit a sliding-window group cannot cover is retried this many times, a chunk shorter each.
    _WINDOW_RETRIES = 4

    def _lookup_groups(self, rid, st, n_computed):
        """A hybrid model's hit (tokens, load_async), or (None, False) while a lookup is unknown
        yet: N tokens are a hit when every full-attention group holds [n_computed, N) and every
        sliding-window group the tokens its window needs before N, [max(n_computed, s(N)), N)
        (the blocks before s(N) are vLLM's null block). st.group_from gets where each group's
        load starts."""
        froms = [n_computed] * len(self._groups)
        end, asyncs = None, set()
        for g in self._groups:
            if g.window:
                continue
            res = self._handles[g.index].lookup(rid, st.tokens, n_computed)
            if res.chunk_tokens:
                self._chunk_tokens = res.chunk_tokens
            if res.unknown_yet:
                return None, False
            got = n_computed + res.hit_tokens
            end = got if end is None else min(end, got)
            if res.hit_tokens:
                asyncs.add(bool(res.load_async))
        if end is None:  # sliding-window groups only: what the first of them holds from n_computed
            end = len(st.tokens) - 1
        chunk = self._chunk_tokens or 1
        tries = self._WINDOW_RETRIES
        if end <= n_computed:  # no hit: the window groups' handles still get the tokens
            for g in self._windows:
                if self._handles[g.index].lookup(rid, st.tokens, n_computed).unknown_yet:
                    return None, False
        while end > n_computed:
            short = False
            for g in self._windows:
                froms[g.index] = max(n_computed, g.first_held(end))
                res = self._handles[g.index].lookup(rid, st.tokens, froms[g.index])
                if res.unknown_yet:
                    return None, False
                if froms[g.index] + res.hit_tokens < end:
                    short = froms[g.index] + res.hit_tokens
                    break
                asyncs.add(bool(res.load_async))
            if short is False:
                break
            tries -= 1
            # the window group holds chunks up to `short` at best: a shorter hit ends there
            shorter = min(end - 1, short) // chunk * chunk
            end = shorter if tries > 0 and shorter > n_computed else n_computed
        st.group_from = froms
        if end <= n_computed or len(asyncs) > 1:  # no hit, or groups that disagree on async
            return 0, False
        return end - n_computed, asyncs == {True}

    def _handoff_pending(self, request, st, found):
        """A consumer's request whose producer said it stored more than the tiers hold yet: True
        (ask again next step) until they do or the hand-off wait runs out; then the hit found is
        taken and the engine recomputes the rest (a miss, never wrong KV)."""
        params = getattr(request, "kv_transfer_params", None) or {}
        try:
            want = int(params.get(STORED_TOKENS_PARAM) or 0)
        except (TypeError, ValueError, AttributeError):
            return False
        # a hit ends on a chunk boundary and leaves the prompt's last token to the engine
        want = min(want, len(st.tokens) - 1)
        if self._chunk_tokens:
            want -= want % self._chunk_tokens
        if want <= 0 or found >= want:
            return False
        now = time.monotonic()
        if st.handoff_deadline is None:
            st.handoff_deadline = now + self._handoff_wait_s
        return now < st.handoff_deadline

    def _count_tenant(self, tenant, hit, miss):
        if tenant not in self._tenant_labels:
            # the Prometheus children live as long as the process: a bounded set of labels
            if len(self._tenant_labels) < MAX_TENANT_LABELS:
                self._tenant_labels.add(tenant)
            else:
                tenant = "other"
        t = self._tenants.get(tenant)
        if t is None:
            t = self._tenants[tenant] = {"lookups": 0, "hit_tokens": 0, "miss_tokens": 0}
        t["lookups"] += 1
        t["hit_tokens"] += hit
        t["miss_tokens"] += miss

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        st = self._track(request)
        if st.bypass:
            return
        self._set_tables(st, blocks.get_block_ids() if blocks is not None else None)
        if num_external_tokens == 0 and (not st.looked_up or st.async_armed):
            # Never looked up, or the second call vLLM makes when a request whose load ran
            # asynchronously is scheduled again (its KV is in the pages): not a cancel. The
            # library releases that load's lease when the request computes again.
            st.async_armed = False
            return
        end = st.lookup_computed + int(num_external_tokens)
        for g, h in zip(self._groups, self._handles):
            # a sliding-window group loads from the first token its window needs (group_from)
            n = 0
            if num_external_tokens:
                n = end - (st.group_from[g.index] if st.group_from else st.lookup_computed)
            try:
                h.on_alloc(request.request_id, st.tables[g.index], n)
            except _abi.NotFound:
                if n:
                    raise
        st.async_armed = bool(num_external_tokens and st.load_async)
        st.load_pending = bool(num_external_tokens)
        if st.load_pending:
            st.skip_from = _NEVER  # the next step carries its load

    def _set_tables(self, st, block_ids):
        """st's block tables become vLLM's (block ids per group); a sliding-window group's null
        blocks (id 0) become BLOCK_NONE."""
        tables = _per_group(block_ids, self._n_groups) or [[] for _ in self._groups]
        for g in self._windows:
            tables[g.index] = [BLOCK_NONE if b == 0 else b for b in tables[g.index]]
        st.tables = tables
        st.sent_tables = [0] * len(tables)
        st.marked = [0] * len(tables)

    def _extend_tables(self, st, new_block_ids):
        new = _per_group(new_block_ids, self._n_groups)
        if not new:
            return
        for g, ids in enumerate(new):
            if ids:
                st.tables[g].extend(ids)
        for g in self._windows:
            t = st.tables[g.index]
            for i in range(len(t) - len(new[g.index]), len(t)):
                if t[i] == 0:
                    t[i] = BLOCK_NONE

    def _mark_window(self, st, n_computed):
        """vLLM frees a sliding-window group's blocks out of the window as the request computes
        (and does not say so in the scheduler output): they become BLOCK_NONE here, so the library
        saves no chunk over them. Marks at least what vLLM freed (it frees on fewer tokens)."""
        for g in self._windows:
            t = st.tables[g.index]
            upto = min(len(t), g.first_held(n_computed) // g.block_tokens)
            first = st.marked[g.index]
            if upto <= first:
                continue
            for i in range(first, upto):
                t[i] = BLOCK_NONE
            st.marked[g.index] = upto
            st.sent_tables[g.index] = min(st.sent_tables[g.index], first)

    def _new_request(self, nr):
        """A request vLLM schedules for the first time (or again after a preemption, in releases
        that list those as new): its state with the tokens and block tables nr gives, or None when
        it bypasses the connector."""
        st = self._requests.get(nr.req_id)
        if st is None:
            st = self._requests[nr.req_id] = _SchedRequest(None, _bypass_reason(nr),
                                                           self._n_groups)
        self._key(nr.req_id, st, st.request if st.request is not None else nr)
        if st.bypass:
            return None
        if st.request is not None:
            _set_tokens(st, st.request.all_token_ids)
        elif nr.prompt_token_ids is not None:
            _set_tokens(st, nr.prompt_token_ids)
        if st.prompt_tokens is None and nr.prompt_token_ids is not None:
            st.prompt_tokens = len(nr.prompt_token_ids)
        self._set_tables(st, nr.block_ids)
        self._mark_window(st, nr.num_computed_tokens)
        return st

    def build_connector_meta(self, scheduler_output):
        if self._meta_updates:
            return self._build_connector_meta_update(scheduler_output)
        steps = []
        num_scheduled = scheduler_output.num_scheduled_tokens
        for nr in scheduler_output.scheduled_new_reqs:
            st = self._new_request(nr)
            if st is None:
                continue
            steps.append(self._step(nr.req_id, st, nr.num_computed_tokens,
                                    num_scheduled.get(nr.req_id, 0)))
        cached = scheduler_output.scheduled_cached_reqs
        resumed = self._resumed_ids(cached)
        all_tokens = getattr(cached, "all_token_ids", None) or {}
        new_token_ids = getattr(cached, "new_token_ids", None) or []
        for i, rid in enumerate(cached.req_ids):
            st = self._requests.get(rid)
            if st is None:
                if rid not in all_tokens:
                    continue  # never seen and no tokens given: nothing to save or load
                st = self._requests[rid] = _SchedRequest(None, None, self._n_groups)
            self._key(rid, st, st.request)
            if st.bypass:
                continue
            nb = cached.new_block_ids[i] if i < len(cached.new_block_ids) else None
            if rid in resumed:
                self._set_tables(st, nb)
            elif nb:
                self._extend_tables(st, nb)
            self._mark_window(st, cached.num_computed_tokens[i])
            if rid in all_tokens:
                st.tokens = array.array("i", all_tokens[rid])
            elif st.request is not None:
                _set_tokens(st, st.request.all_token_ids)
            elif i < len(new_token_ids) and new_token_ids[i]:
                st.tokens.extend(new_token_ids[i])
            steps.append(self._step(rid, st, cached.num_computed_tokens[i], num_scheduled.get(rid, 0)))
        blobs = [h.build_meta([s[g] for s in steps]) for g, h in enumerate(self._handles)]
        return self._metadata(blobs, [s[0].req_id for s in steps])

    def _metadata(self, blobs, req_ids):
        kept, self._kept_groups = self._kept_groups, {}
        return KvstrataConnectorMetadata(blobs[0], req_ids, blobs=blobs, sending_groups=kept)

    def _build_connector_meta_update(self, so):
        """build_connector_meta over ABI 1.10's build_meta_update: each request's tokens and block
        table live in the library, so a step hands over only what changed, and a request that can
        neither load nor save in the step (decoding past its prompt, no load armed, decode tokens
        not saved) is not handed over at all: the step's cost does not grow with context."""
        updates = []
        num_scheduled = so.num_scheduled_tokens
        requests = self._requests
        for nr in so.scheduled_new_reqs:
            rid = nr.req_id
            st = self._new_request(nr)
            if st is None:
                continue
            updates.append(self._update(rid, st, nr.num_computed_tokens, num_scheduled.get(rid, 0)))
            self._after_update(st)
        cached = so.scheduled_cached_reqs
        resumed = self._resumed_ids(cached)
        all_tokens = getattr(cached, "all_token_ids", None) or {}
        new_token_ids = getattr(cached, "new_token_ids", None) or []
        get = requests.get
        single = self._n_groups == 1
        # The loop runs for every running request each step: a decoding one (skip_from, below) costs
        # a lookup, a comparison and, when vLLM gave it a block, an append.
        i = -1
        for rid, nb, n_computed in zip(cached.req_ids, cached.new_block_ids,
                                       cached.num_computed_tokens):
            i += 1
            st = get(rid)
            if st is not None and n_computed >= st.skip_from:
                # bypassed, or decoding: nothing of it can load or save in this step (a resumed
                # request comes with its whole table, so only one with blocks can be one)
                if not nb:
                    continue
                if rid not in resumed:
                    if single:
                        st.tables[0].extend(nb[0] if type(nb) is tuple else _group0(nb))
                    else:
                        self._extend_tables(st, nb)
                    continue
            if st is None:
                if rid not in all_tokens:
                    continue  # never seen and no tokens given: nothing to save or load
                st = requests[rid] = _SchedRequest(None, None, self._n_groups)
                self._key(rid, st, None)
            if st.bypass:
                st.skip_from = 0
                continue
            if rid in resumed:
                self._set_tables(st, nb)
            elif nb:
                self._extend_tables(st, nb)
            if self._windows:
                self._mark_window(st, n_computed)
            if rid in all_tokens:
                _set_tokens(st, all_tokens[rid])
            elif st.request is not None:
                _set_tokens(st, st.request.all_token_ids)
            elif i < len(new_token_ids) and new_token_ids[i]:
                st.tokens.extend(new_token_ids[i])
            updates.append(self._update(rid, st, n_computed, num_scheduled.get(rid, 0)))
            self._after_update(st)
        try:
            blobs = [h.build_meta_update([u[g] for u in updates])
                     for g, h in enumerate(self._handles)]
        except Exception:
            # what the library holds is unknown now: the next step hands these requests over whole
            for u in updates:
                st = requests.get(u[0].req_id)
                if st is not None:
                    st.sent = 0
                    st.sent_tables = [0] * len(st.tables)
            raise
        return self._metadata(blobs, [u[0].req_id for u in updates])

    @staticmethod
    def _update(rid, st, n_computed, n_scheduled):
        """The request's update for each group's handle (tokens alike, block tables per group)."""
        n_tokens = len(st.tokens)
        n_computed = min(int(n_computed), n_tokens)
        n_scheduled = max(0, min(int(n_scheduled), n_tokens - n_computed))
        sent = min(st.sent, n_tokens)
        tokens = st.tokens[sent:]
        out = []
        for g, table in enumerate(st.tables):
            sent_blocks = min(st.sent_tables[g], len(table))
            out.append(_abi.StepUpdate(rid, sent, tokens, sent_blocks,
                                       array.array("I", table[sent_blocks:]), n_computed,
                                       n_scheduled))
            st.sent_tables[g] = len(table)
        st.sent = n_tokens
        st.load_pending = False
        return out

    def _after_update(self, st):
        """From which n_computed on the request need not be handed over: past its prompt when
        decode tokens are not saved (it can then neither load nor save until vLLM preempts it or
        rolls it back below that)."""
        st.skip_from = (st.prompt_tokens if not self._decode_saves and st.prompt_tokens is not None
                        else _NEVER)

    @staticmethod
    def _resumed_ids(cached):
        resumed = getattr(cached, "resumed_req_ids", None)
        if resumed is not None:
            return resumed
        # releases before resumed_req_ids flag each cached request with resumed_from_preemption; a
        # resumed request's new_block_ids is its whole table, never an extension
        flags = getattr(cached, "resumed_from_preemption", None)
        if flags is None:
            raise KvstrataConfigError(
                "this vLLM's CachedRequestData has neither resumed_req_ids nor "
                "resumed_from_preemption: kvstrata cannot tell a resumed request's block table "
                "from an extension of it")
        return {rid for rid, flag in zip(cached.req_ids, flags) if flag}

    @staticmethod
    def _step(rid, st, n_computed, n_scheduled):
        n_tokens = len(st.tokens)
        # Tokens not known yet (async scheduling's placeholders, speculative drafts) are not saved.
        n_computed = min(int(n_computed), n_tokens)
        n_scheduled = max(0, min(int(n_scheduled), n_tokens - n_computed))
        return [_abi.StepSpec(rid, st.tokens, table, n_computed, n_scheduled)
                for table in st.tables]

    def request_finished(self, request, block_ids):
        st = self._requests.pop(request.request_id, None)
        if st is None or (st.bypass and not (st.keyed or st.looked_up)):
            return False, None  # (a request bypassed after the library saw it is still told)
        kept = known = 0
        for h in self._handles:
            try:
                kept += bool(h.request_finished(request.request_id))
                known += 1
            except _abi.NotFound:
                pass
        if not known:
            return False, None  # the library never saw it (finished before any lookup or step)
        keep = kept > 0
        if keep and len(self._handles) > 1:
            self._kept_groups[request.request_id] = kept
        params = None
        if self._transfer_role == _abi.TRANSFER_PRODUCER and self._chunk_tokens and not st.bypass:
            # what the saves store: the computed prompt, whole chunks (vLLM returns the params with
            # the request's output and a proxy hands them to the decode request)
            n = min(int(request.num_computed_tokens), int(request.num_prompt_tokens))
            params = {STORED_TOKENS_PARAM: n - n % self._chunk_tokens}
        return keep, params

    def request_finished_all_groups(self, request, block_ids):
        return self.request_finished(request, block_ids)

    def take_events(self):
        # kvstrata's events name chunk keys (hashes of whole prefixes, per model fingerprint), not
        # vLLM's block hashes, so a KV-event consumer could not match them: none are forwarded.
        return ()

    # -- worker side --

    def register_kv_caches(self, kv_caches):
        # Layers that share another layer's KV (vLLM's kv_sharing_target_layer_name) are in no KV
        # cache group but come with their target's tensor: they are the target's layer here,
        # stored and loaded once, and their hooks are the target's (a save is gathered by the
        # target's hook only). Layers a group names are layers of their own even when their
        # tensors alias another's memory (vLLM's hybrid allocator shares one buffer among groups).
        grouped = set()
        group_of = {}
        for gi, g in enumerate(getattr(self._kv_cache_config, "kv_cache_groups", None) or ()):
            grouped.update(g.layer_names)
            group_of.update((n, gi) for n in g.layer_names)
        layers, index, owner = [], {}, {}
        pending = []
        for name, t in kv_caches.items():
            ident = (int(t.data_ptr()), _shape(t), _strides(t), str(t.device))
            if grouped and name not in grouped:
                pending.append((name, ident))
                continue
            if not grouped and ident in owner:
                pending.append((name, ident))
                continue
            owner.setdefault(ident, len(layers))
            index[name] = len(layers)
            layers.append((name, t))
        for name, ident in pending:
            if ident not in owner:
                raise KvstrataConfigError(
                    f"kvstrata: layer {name!r} is in no KV cache group and its tensor is no other "
                    "layer's: it is neither an attention layer kvstrata stores nor one sharing "
                    "another layer's KV")
            index[name] = owner[ident]
            self._shared_layers.add(name)
        if len(getattr(self, "_handles", ())) > 1:
            self._register_groups(layers, index, group_of)
            return
        self._register(layers, index)

    def _register_groups(self, layers, index, group_of):
        """A hybrid model: each group's handle registers that group's layers (in vLLM's order);
        a layer name maps to (group, index in its group)."""
        per_group = [[] for _ in self._groups]
        where = {}
        for i, (name, t) in enumerate(layers):
            g = group_of[name]
            where[i] = (g, len(per_group[g]))
            per_group[g].append((name, t))
        views = []
        for g, (h, desc) in enumerate(zip(self._handles, self._models)):
            if len(per_group[g]) != desc.n_layers:
                raise KvstrataConfigError(
                    f"kvstrata: vLLM registered {len(per_group[g])} layers of KV cache group {g}, "
                    f"but its description (from kv_cache_config) has {desc.n_layers}")
            v = [layer_view(name, t, desc) for name, t in per_group[g]]
            h.register_kv(v)
            views += v
        self._cuda = any(v.device_kind == _abi.DEVICE_CUDA for v in views)
        self._kv_tensors = [t for _n, t in layers]  # the pages must outlive the handles
        self._layer_names = [n for n, _t in layers]
        self._layer_index = {name: where[i] for name, i in index.items()}

    def register_cross_layers_kv_cache(self, kv_cache, attn_backend):
        try:
            order = tuple(attn_backend.get_kv_cache_stride_order(include_num_layers_dimension=True))
        except (AttributeError, NotImplementedError, TypeError):
            order = tuple(range(kv_cache.dim()))
        if sorted(order) != list(range(kv_cache.dim())):
            raise KvstrataConfigError(
                f"kvstrata: the attention backend's stride order {order} does not fit the "
                f"cross-layer KV cache of shape {tuple(kv_cache.shape)}")
        logical = kv_cache.permute(*[order.index(i) for i in range(len(order))])
        names = self._cross_layer_names(int(logical.shape[0]))
        index = {}
        for i, group in enumerate(names):
            for n in group:
                index[n] = i
        self._register([(group[0], logical[i]) for i, group in enumerate(names)], index)

    def _cross_layer_names(self, n_layers):
        kcc = self._kv_cache_config
        tensors = getattr(kcc, "kv_cache_tensors", None) if kcc else None
        if tensors and len(tensors) == n_layers:
            return [list(t.shared_by) for t in tensors]
        groups = getattr(kcc, "kv_cache_groups", None) if kcc else None
        if groups and len(groups[0].layer_names) == n_layers:
            return [[n] for n in groups[0].layer_names]
        raise KvstrataConfigError(
            f"kvstrata: the cross-layer KV cache holds {n_layers} layers, and the KV cache config "
            "names no layer list of that length")

    def _register(self, layers, index):
        desc = self._model
        if len(layers) != desc.n_layers:
            raise KvstrataConfigError(
                f"kvstrata: vLLM registered {len(layers)} KV cache layers, but the model "
                f"description (from vllm_config) has {desc.n_layers}")
        views = [layer_view(name, t, desc) for name, t in layers]
        self._cuda = any(v.device_kind == _abi.DEVICE_CUDA for v in views)
        self._handle.register_kv(views)
        self._kv_tensors = [t for _n, t in layers]  # the pages must outlive the handle
        self._layer_names = [n for n, _t in layers]
        self._layer_index = dict(index)

    def _layer(self, layer_name):
        """(handle, layer index in its handle) of a registered layer."""
        try:
            at = self._layer_index[layer_name]
            if isinstance(at, tuple):
                return self._handles[at[0]], at[1]
            return self._handle, at
        except KeyError:
            raise KvstrataConfigError(
                f"kvstrata: layer {layer_name!r} was not registered (register_kv_caches named "
                f"{len(self._layer_index)} layers)") from None

    def bind_connector_metadata(self, connector_metadata):
        super().bind_connector_metadata(connector_metadata)
        if self._kv_tensors is None or not isinstance(connector_metadata, KvstrataConnectorMetadata):
            return
        # A step still bound (no forward pass ran: no layer hooks, no wait_for_save) is closed by the
        # library here (ABI 1.5).
        blobs = getattr(connector_metadata, "blobs", None) or [connector_metadata.blob]
        if len(blobs) != len(self._handles):
            raise KvstrataConfigError(
                f"kvstrata: the step's metadata has {len(blobs)} blobs for {len(self._handles)} "
                "KV cache groups")
        for h, blob in zip(self._handles, blobs):
            h.bind_meta(blob)
        self._expect_sending.update(getattr(connector_metadata, "sending_groups", None) or {})
        self._bound = True
        self._started = False

    def clear_connector_metadata(self):
        super().clear_connector_metadata()
        self._started = False
        self._bound = False

    def handle_preemptions(self, kv_connector_metadata):
        # wait_for_save completes the gathers out of the pages (asynchronous saves only store from
        # the library's own buffers afterwards), so a preempted request's pages are never read
        # after its step: nothing to wait for.
        return None

    def _start(self):
        if self._started:
            return
        if self._cuda:
            import torch

            stream = torch.cuda.current_stream().cuda_stream
            for h in self._handles:
                h.set_stream(stream)
        for h in self._handles:
            h.start_load()
        self._started = True

    def start_load_kv(self, forward_context, **kwargs):
        if self._bound:
            self._start()

    def wait_for_layer_load(self, layer_name):
        if not self._bound:
            return
        h, layer = self._layer(layer_name)
        self._start()  # vLLM may run the layers first when the step has no synchronous load
        h.wait_layer_load(layer)

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        if not self._bound or layer_name in self._shared_layers:
            return
        h, layer = self._layer(layer_name)
        self._start()
        h.save_layer(layer)

    def wait_for_save(self):
        if not self._bound:
            return
        self._start()
        for h in self._handles:
            h.wait_save()

    def get_finished(self, finished_req_ids):
        if self._handle is None or self._kv_tensors is None:
            return None, None
        if len(self._handles) == 1:
            sending, receiving = self._handle.get_finished()
            return (set(sending) or None), (set(receiving) or None)
        # a request is finished when every group's handle that holds work of it reported it
        done_sending, done_recving = set(), set()
        n = len(self._handles)
        for h in self._handles:
            sending, receiving = h.get_finished()
            for rid in sending:
                c = self._pending_sending[rid] = self._pending_sending.get(rid, 0) + 1
                if c >= self._expect_sending.get(rid, n):
                    done_sending.add(rid)
            for rid in receiving:
                c = self._pending_recving[rid] = self._pending_recving.get(rid, 0) + 1
                if c >= n:
                    done_recving.add(rid)
        for rid in done_sending:
            del self._pending_sending[rid]
            self._expect_sending.pop(rid, None)
        for rid in done_recving:
            del self._pending_recving[rid]
        return (done_sending or None), (done_recving or None)

    def get_block_ids_with_load_errors(self):
        if self._handle is None or self._kv_tensors is None:
            return set()
        out = set()
        for h in self._handles:  # vLLM's block ids are global across groups
            out.update(h.load_error_blocks())
        return out

    def get_kv_connector_stats(self):
        if self._handle is None:
            return None
        now = self._stats()
        data = stats_delta(now, self._last_stats, self._tier_names,
                            with_tokens=self._scheduler or self._model.tp_rank == 0)
        self._last_stats = now
        if self._tenants:
            data["tenants"], self._tenants = self._tenants, {}
        stats = KvstrataConnectorStats(data=data)
        return None if stats.is_empty() else stats

    # Per-request counters (lookups, tokens, async loads, closed steps) are group 0's: every group's
    # handle counts the same requests. Chunks, bytes and times are summed over the groups.
    _GROUP_SUMMED = ("chunks_loaded", "bytes_loaded", "load_ns", "chunks_saved", "bytes_saved",
                     "save_ns", "saves_skipped", "load_errors", "evictions", "lossy_chunks_loaded",
                     "tier_chunks_loaded", "tier_bytes_loaded", "tier_load_ns")

    def _stats(self):
        now = self._handle.stats()
        for h in self._handles[1:]:
            more = h.stats()
            for k in self._GROUP_SUMMED:
                if k not in now or k not in more:
                    continue
                if isinstance(now[k], list):
                    now[k] = [a + b for a, b in zip(now[k], more[k])]
                else:
                    now[k] += more[k]
        return now

    def shutdown(self):
        hs, self._handles = getattr(self, "_handles", None) or [], []
        h, self._handle = self._handle, None
        if h is not None and h not in hs:
            hs = [h] + hs
        for h in reversed(hs):
            h.close()
        _open_connectors.discard(self)
        if self._tmpdir:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
            self._tmpdir = None
