"""How kvstrata sees a vLLM instance: the model description both connector roles derive from
vllm_config and kv_cache_config (one per KV cache group), the layer views read from vLLM's KV cache
tensors' strides, and the default configuration (one DRAM tier in POSIX shared memory).
KvstrataConnector (kvstrata.vllm) builds on them; nothing here opens the library."""

import re

from kvstrata import _abi

DEFAULT_DRAM_CAPACITY = "4GiB"
DEFAULT_CHUNK_TOKENS = 256


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




def _tp_rank(vllm_config, tp_size):
    """This worker's tensor-parallel rank: vLLM's process group when it is up, else the parallel
    config's global rank modulo the TP size (vLLM orders ranks TP-fastest)."""
    try:
        from vllm.distributed.parallel_state import get_tensor_model_parallel_rank

        return int(get_tensor_model_parallel_rank())
    except Exception:  # no vLLM, or the group is not initialised (tests, some executors)
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
