"""ctypes binding of abi/kvstrata.h, ABI 1.10.

The header's constants and structs are kvstrata._abi_types' (re-exported here); the table (kvs_api) is
read only up to its own struct_size. A failed call raises a KvsError
subclass carrying the status and the handle's last_error sentence. `Handle` wraps open/close and every
hook with Python arguments (lists of ints, str ids, bytes for metadata).

The library is found on first use, never at import: KVSTRATA_LIBRARY (a path), else libkvstrata.so in
this package's folder, else the system loader.
"""

import array
import ctypes
import ctypes.util
import os
import threading
from collections import namedtuple

from kvstrata._abi_types import (  # noqa: F401 - the ABI's names are this module's too
    ABI_MAJOR,
    ABI_MINOR,
    OK,
    EINVAL,
    ENOMEM,
    ENOTFOUND,
    EIO,
    ECONFIG,
    EVERSION,
    ESTATE,
    ETIMEDOUT,
    ENOTSUP,
    ECORRUPT,
    EAGAIN,
    EOVERFLOW,
    ROLE_SCHEDULER,
    ROLE_WORKER,
    ROLE_BOTH,
    TRANSFER_BOTH,
    TRANSFER_PRODUCER,
    TRANSFER_CONSUMER,
    DTYPE_FP16,
    DTYPE_BF16,
    DTYPE_FP32,
    DTYPE_FP8_E4M3,
    DTYPE_FP8_E5M2,
    DTYPE_BYTES,
    DTYPE_NAMES,
    DEVICE_HOST,
    DEVICE_CUDA,
    EVENT_STORED,
    EVENT_REMOVED,
    MAX_STAGES,
    STATS_MAX_TIERS,
    PLAN_CAP_TOKEN,
    PLAN_CAP_LAYER,
    PLAN_CAP_STAGE,
    PLAN_CAP_MASK,
    PLAN_LOAD,
    PLAN_TOKEN,
    PLAN_RECOMPUTE,
    PLAN_LAYER,
    PLAN_STAGE,
    MODEL_DESC_SIZE_1_0,
    OPEN_PARAMS_SIZE_1_0,
    LAYER_VIEW_SIZE_1_0,
    LOOKUP_RESULT_SIZE_1_0,
    RESTORE_PLAN_SIZE_1_3,
    STAGE_DESC_SIZE_1_4,
    STATS_SIZE_1_0,
    STATS_SIZE_1_2,
    MAX_REQ_ID_BYTES,
    c_status,
    ModelDesc,
    OpenParams,
    LayerView,
    LookupResult,
    StepRequest,
    Event,
    RestorePlan,
    StageDesc,
    Stats,
    stats_dict,
    StepUpdateStruct,
    STEP_UPDATE_SIZE_1_10,
    HandleInfo,
    _Handle,
    _H,
    _F,
    Api,
    HOOK_MINOR,
)

# --- errors -------------------------------------------------------------------------------------------


class KvsError(Exception):
    """A kvs_status other than KVS_OK. .status is the code, .hook the call, .last_error the handle's
    sentence (or the library's strerror when no handle was there to say more)."""

    status = None

    def __init__(self, hook, status, last_error=""):
        self.hook = hook
        self.status = status
        self.last_error = last_error or ""
        name = STATUS_NAMES.get(status, str(status))
        text = f"kvstrata {hook} failed ({name})"
        if self.last_error:
            text += f": {self.last_error}"
        super().__init__(text)


class InvalidArgument(KvsError):
    pass


class OutOfMemory(KvsError):
    pass


class NotFound(KvsError):
    pass


class IOFailure(KvsError):
    pass


class ConfigError(KvsError):
    pass


class VersionMismatch(KvsError):
    pass


class WrongState(KvsError):
    pass


class TimedOut(KvsError):
    pass


class NotSupported(KvsError):
    pass


class Corrupt(KvsError):
    pass


class TryAgain(KvsError):
    pass


class Overflow(KvsError):
    pass


STATUS_NAMES = {
    OK: "KVS_OK", EINVAL: "KVS_EINVAL", ENOMEM: "KVS_ENOMEM", ENOTFOUND: "KVS_ENOTFOUND",
    EIO: "KVS_EIO", ECONFIG: "KVS_ECONFIG", EVERSION: "KVS_EVERSION", ESTATE: "KVS_ESTATE",
    ETIMEDOUT: "KVS_ETIMEDOUT", ENOTSUP: "KVS_ENOTSUP", ECORRUPT: "KVS_ECORRUPT",
    EAGAIN: "KVS_EAGAIN", EOVERFLOW: "KVS_EOVERFLOW",
}

ERROR_CLASSES = {
    EINVAL: InvalidArgument, ENOMEM: OutOfMemory, ENOTFOUND: NotFound, EIO: IOFailure,
    ECONFIG: ConfigError, EVERSION: VersionMismatch, ESTATE: WrongState, ETIMEDOUT: TimedOut,
    ENOTSUP: NotSupported, ECORRUPT: Corrupt, EAGAIN: TryAgain, EOVERFLOW: Overflow,
}
for _code, _cls in ERROR_CLASSES.items():
    _cls.status = _code


def error_for(hook, status, last_error=""):
    """The KvsError subclass instance for a status."""
    return ERROR_CLASSES.get(status, KvsError)(hook, status, last_error)


class LibraryNotFound(OSError):
    """libkvstrata could not be loaded from any of the places it is looked for."""


# --- the library --------------------------------------------------------------------------------------

_lock = threading.Lock()
_lib = None
_lib_path = None
_api = None


def _package_dir():
    return os.path.dirname(os.path.abspath(__file__))


def library_loaded():
    """True once this process has loaded libkvstrata through this module."""
    return _lib is not None


def library_path():
    """The path (or loader name) the library was loaded from; None before it is loaded."""
    return _lib_path


def load_library():
    """Load libkvstrata once: KVSTRATA_LIBRARY if set (and only it), else libkvstrata.so in this
    package's folder, else the system loader. Raises LibraryNotFound with one sentence."""
    global _lib, _lib_path
    with _lock:
        if _lib is not None:
            return _lib
        env = os.environ.get("KVSTRATA_LIBRARY")
        if env:
            try:
                lib = ctypes.CDLL(env)
            except OSError as e:
                raise LibraryNotFound(
                    f"kvstrata: KVSTRATA_LIBRARY={env} cannot be loaded ({e}); the package folder "
                    f"and the system loader are not tried while KVSTRATA_LIBRARY is set") from None
            _lib, _lib_path = lib, env
            return lib
        pkg = _package_dir()
        for name in ("libkvstrata.so", "libkvstrata.so.1"):
            path = os.path.join(pkg, name)
            if os.path.exists(path):
                try:
                    lib = ctypes.CDLL(path)
                except OSError as e:
                    raise LibraryNotFound(f"kvstrata: {path} cannot be loaded ({e})") from None
                _lib, _lib_path = lib, path
                return lib
        candidates = []
        found = ctypes.util.find_library("kvstrata")
        if found:
            candidates.append(found)
        candidates += ["libkvstrata.so.1", "libkvstrata.so"]
        for name in candidates:
            try:
                lib = ctypes.CDLL(name)
            except OSError:
                continue
            _lib, _lib_path = lib, name
            return lib
        raise LibraryNotFound(
            "kvstrata: libkvstrata.so was not found: KVSTRATA_LIBRARY is not set, the package "
            f"folder {pkg} holds no libkvstrata.so, and the system loader finds no "
            "libkvstrata.so.1 (build it with `make build` and set "
            "KVSTRATA_LIBRARY=<repo>/build/lib/libkvstrata.so, or `make install` it)")


def get_api():
    """The library's table for ABI major 1 (loads the library first)."""
    global _api
    if _api is not None:
        return _api
    lib = load_library()
    get = lib.kvs_get_api
    get.restype = ctypes.POINTER(Api)
    get.argtypes = [ctypes.c_uint32]
    p = get(ABI_MAJOR)
    if not p:
        raise VersionMismatch("kvs_get_api", EVERSION,
                              f"{_lib_path} does not implement ABI major {ABI_MAJOR}")
    api = p.contents
    if api.abi_major != ABI_MAJOR or api.struct_size < Api.set_stream.offset:
        raise VersionMismatch(
            "kvs_get_api", EVERSION,
            f"{_lib_path} returned a table of ABI {api.abi_major}.{api.abi_minor} with "
            f"{api.struct_size} bytes, shorter than ABI 1.0's {Api.set_stream.offset}")
    _api = api
    return api


def has_hook(name):
    """Whether the loaded table carries hook `name` (its struct_size covers it)."""
    api = get_api()
    field = getattr(Api, name)
    return api.struct_size >= field.offset + field.size and api.abi_minor >= HOOK_MINOR.get(name, 0)


def require_minor(minor, what):
    """Raise VersionMismatch unless the loaded library implements ABI 1.`minor`."""
    api = get_api()
    if api.abi_minor < minor:
        raise VersionMismatch(
            what, EVERSION,
            f"{what} needs libkvstrata ABI 1.{minor}; {_lib_path} implements "
            f"{api.abi_major}.{api.abi_minor}")


def strerror(status):
    """The library's sentence for a status."""
    s = get_api().strerror(status)
    return s.decode() if s else STATUS_NAMES.get(status, str(status))


# --- a handle -----------------------------------------------------------------------------------------

# lossy_tokens (ABI 1.6): of hit_tokens, those that load lossy (docs/compress.md)
# chunk_tokens: the handle's chunk size (1.10; 0 from an older library)
Lookup = namedtuple("Lookup", "hit_tokens unknown_yet load_async lossy_tokens chunk_tokens",
                    defaults=(0, 0))
Plan = namedtuple("Plan", "mode first_token end_token recompute_tokens predicted_ms "
                          "recompute_layers stage_recompute_layers")


def _c_id(req_id, hook):
    b = req_id.encode() if isinstance(req_id, str) else bytes(req_id)
    if len(b) > MAX_REQ_ID_BYTES or b"\0" in b:
        raise InvalidArgument(hook, EINVAL,
                              f"request id {req_id!r} is longer than {MAX_REQ_ID_BYTES} bytes "
                              "or holds a NUL byte")
    return b


def _int32s(values):
    arr = values if isinstance(values, array.array) and values.typecode == "i" else \
        array.array("i", values)
    n = len(arr)
    if n == 0:
        return arr, None, 0
    return arr, (ctypes.c_int32 * n).from_buffer(arr), n


def _uint32s(values):
    arr = values if isinstance(values, array.array) and values.typecode == "I" else \
        array.array("I", values)
    n = len(arr)
    if n == 0:
        return arr, None, 0
    return arr, (ctypes.c_uint32 * n).from_buffer(arr), n


class StepSpec:
    """One request scheduled in a step (kvs_step_request) in Python terms."""

    __slots__ = ("req_id", "tokens", "block_ids", "n_computed", "n_scheduled")

    def __init__(self, req_id, tokens, block_ids, n_computed, n_scheduled):
        self.req_id = req_id
        self.tokens = tokens
        self.block_ids = block_ids
        self.n_computed = n_computed
        self.n_scheduled = n_scheduled


class StepUpdate:
    """One request of a step as what changed since the library last saw it (kvs_step_update):
    its tokens become its first tokens_from held ones followed by `tokens`, its block table its
    first blocks_from held ids followed by `block_ids`. tokens and block_ids are sequences of ints or,
    to pass them without a per-element loop, array('i') / array('I')."""

    __slots__ = ("req_id", "tokens_from", "tokens", "blocks_from", "block_ids", "n_computed",
                 "n_scheduled")

    def __init__(self, req_id, tokens_from, tokens, blocks_from, block_ids, n_computed,
                 n_scheduled):
        self.req_id = req_id
        self.tokens_from = tokens_from
        self.tokens = tokens
        self.blocks_from = blocks_from
        self.block_ids = block_ids
        self.n_computed = n_computed
        self.n_scheduled = n_scheduled


class Handle:
    """One kvs_handle. Calls must be serialised by the caller (the ABI's rule); close() is idempotent.

    model: a ModelDesc or a mapping with its fields (model_id, dtype, n_layers, n_kv_heads, head_dim,
    block_tokens, is_mla, tp_rank, tp_size, salt, vocab_size)."""

    def __init__(self, role, model, config_path=None, transfer_role=TRANSFER_BOTH):
        """transfer_role (1.10): TRANSFER_BOTH, _PRODUCER (only saves) or _CONSUMER (only loads);
        a library older than 1.10 would ignore it, so another role than both needs 1.10."""
        api = get_api()
        if transfer_role != TRANSFER_BOTH and api.abi_minor < 10:
            raise VersionMismatch("open", EVERSION,
                                  f"transfer_role {transfer_role} needs ABI 1.10; the library "
                                  f"implements {api.abi_major}.{api.abi_minor}")
        self._api = api
        self._h = _H()
        if isinstance(model, ModelDesc):
            desc = model
        else:
            m = dict(model)
            desc = ModelDesc(
                struct_size=ctypes.sizeof(ModelDesc),
                model_id=str(m.get("model_id", "")).encode(),
                dtype=int(m["dtype"]), n_layers=int(m["n_layers"]),
                n_kv_heads=int(m["n_kv_heads"]), head_dim=int(m["head_dim"]),
                block_tokens=int(m["block_tokens"]), is_mla=1 if m.get("is_mla") else 0,
                tp_rank=int(m.get("tp_rank", 0)), tp_size=int(m.get("tp_size", 1)),
                salt=m["salt"].encode() if m.get("salt") else None,
                vocab_size=int(m.get("vocab_size", 0)))
        self._desc = desc
        params = OpenParams(struct_size=ctypes.sizeof(OpenParams), role=int(role),
                            config_path=os.fsencode(config_path) if config_path else None,
                            model=ctypes.pointer(desc), transfer_role=int(transfer_role))
        err = ctypes.create_string_buffer(1024)
        st = api.open(ctypes.byref(params), ctypes.byref(self._h), err, len(err))
        if st != OK:
            self._h = None
            raise error_for("open", st, err.value.decode(errors="replace"))
        self.role = int(role)
        self._meta_cap = 64 << 10
        self._id_cap = 4096
        self._blocks_cap = 1024

    # -- plumbing --

    def _handle(self, hook):
        if not self._h:
            raise WrongState(hook, ESTATE, "the handle is closed")
        return self._h

    def _check(self, st, hook):
        if st != OK:
            raise error_for(hook, st, self.last_error())

    def _hook(self, name):
        field = getattr(Api, name)
        if self._api.struct_size < field.offset + field.size or \
                self._api.abi_minor < HOOK_MINOR.get(name, 0):
            raise NotSupported(name, ENOTSUP,
                               f"{name} needs ABI 1.{HOOK_MINOR.get(name, 0)}; the library "
                               f"implements {self._api.abi_major}.{self._api.abi_minor}")
        return getattr(self._api, name)

    @property
    def closed(self):
        return not self._h

    @property
    def abi_minor(self):
        return self._api.abi_minor

    def last_error(self):
        if not self._h:
            return ""
        s = self._api.last_error(self._h)
        return s.decode(errors="replace") if s else ""

    def close(self):
        if self._h:
            h, self._h = self._h, None
            self._api.close(h)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- scheduler role --

    def lookup(self, req_id, tokens, n_computed):
        h = self._handle("lookup")
        rid = _c_id(req_id, "lookup")
        _keep, buf, n = _int32s(tokens)
        out = LookupResult(struct_size=ctypes.sizeof(LookupResult))
        self._check(self._api.lookup(h, rid, buf, n, int(n_computed), ctypes.byref(out)), "lookup")
        return Lookup(int(out.n_hit_tokens), bool(out.unknown_yet), bool(out.load_async),
                      int(out.n_lossy_tokens), int(out.chunk_tokens))

    def request_key_input(self, req_id, from_token, data):
        """Add bytes `data` to req_id's key inputs (ABI 1.10): they enter the keys of the chunk
        holding position from_token and of every later one. Before the request's first lookup."""
        h = self._handle("request_key_input")
        rid = _c_id(req_id, "request_key_input")
        raw = bytes(data)
        self._check(self._hook("request_key_input")(h, rid, int(from_token), raw, len(raw)),
                    "request_key_input")

    def on_alloc(self, req_id, block_ids, n_external_tokens):
        h = self._handle("on_alloc")
        rid = _c_id(req_id, "on_alloc")
        _keep, buf, n = _uint32s(block_ids)
        self._check(self._api.on_alloc(h, rid, buf, n, int(n_external_tokens)), "on_alloc")

    def build_meta(self, steps):
        """steps: a sequence of StepSpec. Returns the metadata blob (bytes)."""
        h = self._handle("build_meta")
        n = len(steps)
        reqs = (StepRequest * n)() if n else None
        keep = []
        for i, s in enumerate(steps):
            rid = _c_id(s.req_id, "build_meta")
            ta, tbuf, tn = _int32s(s.tokens)
            ba, bbuf, bn = _uint32s(s.block_ids)
            keep += [rid, ta, tbuf, ba, bbuf]
            reqs[i] = StepRequest(req_id=rid, tokens=tbuf, n_tokens=tn, block_ids=bbuf,
                                  n_block_ids=bn, n_computed=int(s.n_computed),
                                  n_scheduled=int(s.n_scheduled))
        length = ctypes.c_uint64(0)
        for _ in range(2):
            buf = self._meta_buffer()
            st = self._api.build_meta(h, reqs, n, buf, self._meta_cap, ctypes.byref(length))
            if st == EOVERFLOW and length.value > self._meta_cap:
                self._meta_cap = int(length.value)
                continue
            self._check(st, "build_meta")
            return ctypes.string_at(buf, length.value)
        self._check(st, "build_meta")
        return b""  # not reached

    def _meta_buffer(self):
        """The buffer build_meta writes into: kept between steps (a new one each step would cost a
        clear of its whole size), grown when a step's metadata needs more."""
        buf = getattr(self, "_meta_buf", None)
        if buf is None or len(buf) < self._meta_cap:
            buf = self._meta_buf = ctypes.create_string_buffer(self._meta_cap)
        return buf

    def build_meta_update(self, updates):
        """updates: a sequence of StepUpdate (ABI 1.10). Returns the metadata blob (bytes), the same
        build_meta returns given the requests' whole lists."""
        h = self._handle("build_meta_update")
        fn = self._hook("build_meta_update")
        n = len(updates)
        reqs = (StepUpdateStruct * n)() if n else None
        keep = []
        for i, u in enumerate(updates):
            rid = _c_id(u.req_id, "build_meta_update")
            ta, tbuf, tn = _int32s(u.tokens)
            ba, bbuf, bn = _uint32s(u.block_ids)
            keep += [rid, ta, tbuf, ba, bbuf]
            reqs[i] = StepUpdateStruct(struct_size=ctypes.sizeof(StepUpdateStruct), req_id=rid,
                                 tokens_from=int(u.tokens_from), tokens=tbuf, n_tokens=tn,
                                 blocks_from=int(u.blocks_from), block_ids=bbuf, n_block_ids=bn,
                                 n_computed=int(u.n_computed), n_scheduled=int(u.n_scheduled))
        length = ctypes.c_uint64(0)
        for _ in range(2):
            buf = self._meta_buffer()
            st = fn(h, reqs, n, buf, self._meta_cap, ctypes.byref(length))
            if st == EOVERFLOW and length.value > self._meta_cap:
                self._meta_cap = int(length.value)
                continue
            self._check(st, "build_meta_update")
            return ctypes.string_at(buf, length.value)
        self._check(st, "build_meta_update")
        return b""  # not reached

    def request_finished(self, req_id):
        """Returns keep_blocks: True when the engine must keep the pages until get_finished."""
        h = self._handle("request_finished")
        keep = ctypes.c_int(0)
        self._check(self._api.request_finished(h, _c_id(req_id, "request_finished"),
                                               ctypes.byref(keep)), "request_finished")
        return bool(keep.value)

    def take_events(self, cap=256):
        """Pending cache events as (kind, key bytes, tier index) tuples."""
        h = self._handle("take_events")
        out = (Event * cap)()
        n = ctypes.c_uint64(0)
        self._check(self._api.take_events(h, out, cap, ctypes.byref(n)), "take_events")
        return [(e.kind, bytes(e.key), e.tier) for e in out[:n.value]]

    def set_plan_caps(self, caps):
        self._check(self._hook("set_plan_caps")(self._handle("set_plan_caps"), int(caps)),
                    "set_plan_caps")

    def plan(self, req_id):
        out = RestorePlan(struct_size=ctypes.sizeof(RestorePlan))
        self._check(self._hook("plan")(self._handle("plan"), _c_id(req_id, "plan"),
                                       ctypes.byref(out)), "plan")
        return Plan(out.mode, out.first_token, out.end_token, out.recompute_tokens,
                    out.predicted_ms, out.recompute_layers,
                    list(out.stage_recompute_layers[:out.n_stages]))

    def set_stages(self, n_kv_layers, boundary_layers, first_layers):
        d = StageDesc(struct_size=ctypes.sizeof(StageDesc), n_stages=len(first_layers),
                      n_kv_layers=n_kv_layers, boundary_layers=boundary_layers)
        for i, f in enumerate(first_layers[:MAX_STAGES]):
            d.first_layer[i] = f
        self._check(self._hook("set_stages")(self._handle("set_stages"), ctypes.byref(d)),
                    "set_stages")

    # -- worker role --

    def register_kv(self, views):
        """views: a sequence of LayerView (one per layer, in layer order)."""
        h = self._handle("register_kv")
        n = len(views)
        arr = (LayerView * n)(*views) if n else None
        self._check(self._api.register_kv(h, arr, n), "register_kv")

    def bind_meta(self, blob):
        h = self._handle("bind_meta")
        b = bytes(blob)
        buf = ctypes.create_string_buffer(b, len(b)) if b else None
        self._check(self._api.bind_meta(h, buf, len(b)), "bind_meta")

    def start_load(self):
        self._check(self._api.start_load(self._handle("start_load")), "start_load")

    def wait_layer_load(self, layer):
        self._check(self._api.wait_layer_load(self._handle("wait_layer_load"), int(layer)),
                    "wait_layer_load")

    def save_layer(self, layer):
        self._check(self._api.save_layer(self._handle("save_layer"), int(layer)), "save_layer")

    def wait_save(self):
        self._check(self._api.wait_save(self._handle("wait_save")), "wait_save")

    def get_finished(self):
        """(sending ids, receiving ids) ended since the last call, as lists of str."""
        h = self._handle("get_finished")
        while True:
            cap = self._id_cap
            snd = ctypes.create_string_buffer(cap)
            rcv = ctypes.create_string_buffer(cap)
            ns = ctypes.c_uint64(0)
            nr = ctypes.c_uint64(0)
            st = self._api.get_finished(h, snd, cap, ctypes.byref(ns), rcv, cap, ctypes.byref(nr))
            if st == EOVERFLOW:
                need = (max(ns.value, nr.value) + 1) * (MAX_REQ_ID_BYTES + 1)
                if need <= cap:  # a library that reports no usable count: grow anyway
                    need = cap * 4
                self._id_cap = need
                continue
            self._check(st, "get_finished")
            return _split_ids(snd.raw, ns.value), _split_ids(rcv.raw, nr.value)

    def load_error_blocks(self):
        """Block ids whose load failed in the last bound step (list of int)."""
        h = self._handle("load_error_blocks")
        while True:
            cap = self._blocks_cap
            out = (ctypes.c_uint32 * cap)()
            n = ctypes.c_uint64(0)
            st = self._api.load_error_blocks(h, out, cap, ctypes.byref(n))
            if st == EOVERFLOW or (st == OK and n.value > cap):
                self._blocks_cap = max(int(n.value), cap * 2)
                continue
            self._check(st, "load_error_blocks")
            return list(out[:n.value])

    def load_dropped(self, req_id, first_token, n_tokens):
        """Positions of req_id in [first_token, first_token + n_tokens) the bound step's loads left
        out (ABI 1.7; an engine that declared PLAN_CAP_MASK), as a sorted list of ints. Call it
        between start_load and wait_save."""
        n_tokens = int(n_tokens)
        mask = (ctypes.c_uint8 * max(n_tokens, 1))()
        n = ctypes.c_uint64(0)
        self._check(self._hook("load_dropped")(self._handle("load_dropped"),
                                               _c_id(req_id, "load_dropped"), int(first_token),
                                               n_tokens, mask, ctypes.byref(n)), "load_dropped")
        return [int(first_token) + i for i in range(n_tokens) if mask[i]]

    def stats(self):
        """Counters since open, as a dict (fields the library does not fill read 0); the per-tier
        arrays are lists of n_tiers entries."""
        return stats_dict(self.stats_struct())

    def stats_struct(self):
        """The counters as the library wrote them (a Stats; bytes() of two equal ones are equal)."""
        h = self._handle("stats")
        s = Stats(struct_size=ctypes.sizeof(Stats))
        self._check(self._api.stats(h, ctypes.byref(s)), "stats")
        return s

    def set_stream(self, cuda_stream):
        self._check(self._hook("set_stream")(self._handle("set_stream"),
                                             ctypes.c_void_p(int(cuda_stream) or None)),
                    "set_stream")

    def tier_name(self, tier):
        """Name of tier `tier` of the chain, or None past the last one."""
        s = self._hook("tier_name")(self._handle("tier_name"), int(tier))
        return s.decode() if s else None

    def info(self):
        """What the handle was opened with (ABI 1.10 handle_info), as a dict of its fields."""
        out = HandleInfo(struct_size=ctypes.sizeof(HandleInfo))
        self._check(self._hook("handle_info")(self._handle("handle_info"), ctypes.byref(out)),
                    "handle_info")
        return {name: int(getattr(out, name)) for name, _t in HandleInfo._fields_
                if name != "struct_size"}

    def tier_names(self):
        names = []
        while len(names) < 64:
            n = self.tier_name(len(names))
            if n is None:
                break
            names.append(n)
        return names


def _split_ids(raw, count):
    if count == 0:
        return []
    parts = raw.split(b"\0")
    return [p.decode(errors="replace") for p in parts[:count]]
