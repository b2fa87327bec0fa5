"""ctypes binding of abi/kvstrata_store.h, store ABI 1.0: batches of exists, get, put and remove by
an engine's own keys, into and out of the engine's own buffers.

    from kvstrata.store import Store
    with Store(b"my-model fp16 page16", tenant="alice") as s:
        s.put([b"k0", b"k1"], [bytearray(b"a" * 4096), page1])
        out = [bytearray(4096), bytearray(4096)]
        results = s.get([b"k0", b"k1"], out)   # Result(status, tier, flags, bytes) per key

The library is found on first use through kvstrata._abi's loader (KVSTRATA_LIBRARY, the package's
folder, the system loader). Its kvs_api is read up to its struct_size; store_api (ABI 1.12) gives the
store's own table, read up to its own struct_size.

Buffers: bufs[i] is key i's value, as one piece or a list of pieces (scatter-gather), each a
buffer-protocol object (bytearray, memoryview, numpy array, ctypes array; bytes for a put), a tensor
in host memory (anything with data_ptr(), contiguous; one on a device is refused: the store copies
with the CPU) or an (address, length) tuple. The library owns the memory until the batch's ticket is
collected, so the Store keeps a reference to every object of a batch until wait (or close) collects
its ticket.

Every call may come from any thread at once, as the C store allows; close must not race the others.
A failed call raises StoreError carrying the status and the store's last_error sentence. wait, and
get, put and remove with a timeout_ms, raise StoreTimeout (a TimeoutError) when the batch is not
done in time: the library still reads or writes the batch's buffers, which the Store keeps
referenced; collect it with wait(e.ticket).
"""

import array
import ctypes
import itertools
import os
import threading
from collections import namedtuple

from kvstrata import _abi
from kvstrata._abi import KvsError
from kvstrata._abi_types import (
    OK,
    EINVAL,
    ESTATE,
    ETIMEDOUT,
    EOVERFLOW,
    EVERSION,
    Api,
    StoreApi,
    StoreOpenParams,
    StoreKeys,
    StoreIov,
    StoreSg,
    StoreResult,
    StoreTierUsage,
    StoreStats,
    StoreEventHeader,
    _S,
    STORE_ABI_MAJOR,
    STORE_ABSENT,
    STORE_PRESENT,
    STORE_UNKNOWN,
    STORE_LOCAL,
    STORE_ALL,
    STORE_OVERWRITE,
    STORE_SKIPPED,
    STORE_NO_TIER,
    STORE_OP_GET,
    STORE_OP_PUT,
    STORE_OP_EXISTS,
    STORE_OP_REMOVE,
    STORE_MEM_HOST,
    STORE_MEM_CUDA,
    STORE_EVENT_BYTES,
)

ABSENT = STORE_ABSENT
PRESENT = STORE_PRESENT
UNKNOWN = STORE_UNKNOWN
SKIPPED = STORE_SKIPPED
NO_TIER = STORE_NO_TIER

_NO_BOUND = (1 << 64) - 1  # wait's timeout_ms for "no bound"
_UNFILLED = 0xFF  # exists' states before the library writes them

Result = namedtuple("Result", "status tier flags bytes")
TierUsage = namedtuple("TierUsage",
                       "tier name objects bytes capacity hits hit_bytes puts put_bytes")
Event = namedtuple("Event", "kind tier key16 key")


class StoreError(KvsError):
    """A store call that did not return KVS_OK: .status (kvs_status), .hook (the call), .last_error
    (the store's sentence for the calling thread, or open's error text)."""


class StoreTimeout(TimeoutError):
    """A batch not done within wait's timeout_ms. .ticket is still the batch's: the library goes on
    reading or writing its buffers, which the Store keeps referenced until the ticket is collected;
    collect it with wait(e.ticket) (or let close wait for it)."""

    status = ETIMEDOUT

    def __init__(self, ticket, timeout_ms):
        self.ticket = int(ticket)
        self.timeout_ms = timeout_ms
        super().__init__(f"kvstrata store: ticket {self.ticket} not done within {timeout_ms} ms; "
                         "collect it with wait(e.ticket)")


# --- the table ----------------------------------------------------------------------------------------

_lock = threading.Lock()
_store_api = None


def get_store_api():
    """The library's kvs_store_api for store major 1 (loads the library first). Raises StoreError
    (KVS_EVERSION) when the library is older than ABI 1.12 or has no store of major 1."""
    global _store_api
    with _lock:
        if _store_api is not None:
            return _store_api
        api = _abi.get_api()
        field = Api.store_api
        if api.struct_size < field.offset + field.size or api.abi_minor < 12:
            raise StoreError("store_api", EVERSION,
                             f"the store API needs libkvstrata ABI 1.12; {_abi.library_path()} "
                             f"implements {api.abi_major}.{api.abi_minor}")
        addr = api.store_api(STORE_ABI_MAJOR)
        if not addr:
            raise StoreError("store_api", EVERSION,
                             f"{_abi.library_path()} implements no store API of major "
                             f"{STORE_ABI_MAJOR}")
        p = ctypes.c_void_p(addr)
        head = ctypes.cast(p, ctypes.POINTER(ctypes.c_uint32 * 4)).contents
        size = int(head[2])
        if int(head[0]) != STORE_ABI_MAJOR or size < ctypes.sizeof(StoreApi):
            raise StoreError("store_api", EVERSION,
                             f"{_abi.library_path()} returned a store table of ABI "
                             f"{head[0]}.{head[1]} with {size} bytes, shorter than 1.0's "
                             f"{ctypes.sizeof(StoreApi)}")
        table = StoreApi()
        ctypes.memmove(ctypes.byref(table), addr, min(size, ctypes.sizeof(StoreApi)))
        _store_api = table
        return table


# --- arguments ----------------------------------------------------------------------------------------


def _key_bytes(k):
    if isinstance(k, str):
        return k.encode()
    if isinstance(k, (bytes, bytearray, memoryview)):
        return bytes(k)
    raise TypeError(f"a store key is bytes or str, not {type(k).__name__}")


class _Keys:
    """One kvs_store_keys: the keys' bytes back to back and n + 1 offsets (valid while it lives)."""

    __slots__ = ("data", "offsets", "struct", "n")

    def __init__(self, keys):
        if isinstance(keys, (bytes, str)):
            raise TypeError("keys is a sequence of keys; wrap a single key in a list")
        parts = [_key_bytes(k) for k in keys]
        self.n = len(parts)
        self.data = b"".join(parts)
        self.offsets = array.array("Q", itertools.accumulate((len(p) for p in parts), initial=0))
        off = (ctypes.c_uint64 * len(self.offsets)).from_buffer(self.offsets)
        self.struct = StoreKeys(data=ctypes.cast(ctypes.c_char_p(self.data), ctypes.c_void_p),
                                offsets=ctypes.cast(off, ctypes.POINTER(ctypes.c_uint64)),
                                n=self.n)


def _on_device(obj):
    """The device a tensor-like object lives on when it is not host memory, else None."""
    if getattr(obj, "is_cuda", False) is True:
        return "cuda"
    device = getattr(obj, "device", None)
    kind = getattr(device, "type", device)
    if kind is not None and str(kind) != "cpu":
        return str(kind)
    return None


def _piece(obj, writable, keep, host_only=True):
    """(address, length) of one contiguous piece of memory; what must stay alive goes into keep.
    host_only refuses a tensor on a device: a batch's bytes are copied by the CPU, and a device
    address would be read or written as if it were host memory."""
    if isinstance(obj, tuple):
        if len(obj) != 2:
            raise TypeError("a buffer given as a tuple is (address, length)")
        return int(obj[0]), int(obj[1])
    if hasattr(obj, "data_ptr"):  # a tensor
        where = _on_device(obj)
        if host_only and where is not None:
            raise ValueError(f"a store buffer must be in host memory, not on {where} (copy it to "
                             "the CPU, or pass pinned host memory)")
        if hasattr(obj, "is_contiguous") and not obj.is_contiguous():
            raise ValueError("a tensor buffer must be contiguous")
        if hasattr(obj, "element_size") and hasattr(obj, "numel"):
            length = int(obj.numel()) * int(obj.element_size())
        elif hasattr(obj, "nbytes"):
            length = int(obj.nbytes)
        else:
            raise TypeError(f"{type(obj).__name__} has data_ptr() but no size (numel and "
                            "element_size, or nbytes)")
        keep.append(obj)
        return int(obj.data_ptr()), length
    if isinstance(obj, bytes):
        if writable:
            raise TypeError("a get's buffer must be writable, not bytes")
        keep.append(obj)
        return ctypes.cast(ctypes.c_char_p(obj), ctypes.c_void_p).value or 0, len(obj)
    ai = getattr(obj, "__array_interface__", None)
    if ai is not None and not isinstance(obj, memoryview):  # numpy and its kind
        addr, readonly = ai["data"]
        if readonly and writable:
            raise TypeError("a get's buffer must be writable (this array is read-only)")
        flags = getattr(obj, "flags", None)
        if flags is not None and not flags["C_CONTIGUOUS"]:
            raise ValueError("an array buffer must be C-contiguous")
        keep.append(obj)
        return int(addr), int(obj.nbytes)
    mv = memoryview(obj)
    if not mv.c_contiguous:
        raise ValueError("a buffer must be contiguous")
    if mv.readonly:
        if writable:
            raise TypeError(f"a get's buffer must be writable ({type(obj).__name__} is read-only)")
        # Read-only memory (a slice of bytes, an mmap opened for reading): its address through a
        # zero-copy numpy view, which holds the export while it lives.
        import numpy

        view = numpy.frombuffer(mv, dtype=numpy.uint8)
        keep.append(view)
        return int(view.__array_interface__["data"][0]), int(mv.nbytes)
    arr = (ctypes.c_char * mv.nbytes).from_buffer(mv)  # holds the export: the buffer cannot move
    keep.append(arr)
    return ctypes.addressof(arr), int(mv.nbytes)


def _pieces(buf, writable, keep):
    if isinstance(buf, list):
        return [_piece(b, writable, keep) for b in buf]
    return [_piece(buf, writable, keep)]


class _Sg:
    """One kvs_store_sg for n keys' buffers, and the objects it points into."""

    __slots__ = ("iov", "seg", "struct", "keep")

    def __init__(self, bufs, n, writable):
        if len(bufs) != n:
            raise ValueError(f"{len(bufs)} buffers for {n} keys")
        self.keep = []
        pieces = [_pieces(b, writable, self.keep) for b in bufs]
        total = sum(len(p) for p in pieces)
        self.iov = (StoreIov * max(total, 1))()
        self.seg = (ctypes.c_uint64 * (n + 1))()
        j = 0
        for i, p in enumerate(pieces):
            for addr, length in p:
                self.iov[j].base = addr
                self.iov[j].len = length
                j += 1
            self.seg[i + 1] = j
        self.struct = StoreSg(iov=ctypes.cast(self.iov, ctypes.POINTER(StoreIov)),
                              seg=ctypes.cast(self.seg, ctypes.POINTER(ctypes.c_uint64)))


def _encode(v):
    return v.encode() if isinstance(v, str) else bytes(v)


_KINDS = {"host": STORE_MEM_HOST, "cuda": STORE_MEM_CUDA}


# --- a store ------------------------------------------------------------------------------------------


class Store:
    """One kvs_store. namespace: bytes or str naming the engine's model and KV layout (values under
    one namespace are never found under another); tenant: str, bytes or None; config: a YAML path
    (docs/configuration.md) or None for one 1 GiB DRAM tier; threads, max_value_bytes and
    event_capacity as kvs_store_open_params says (0: the library's default)."""

    def __init__(self, namespace, tenant=None, config=None, threads=0, max_value_bytes=0,
                 event_capacity=0):
        api = get_store_api()
        self._api = api
        self._s = None
        ns = _encode(namespace)
        tn = _encode(tenant) if tenant else None
        ns_buf = ctypes.create_string_buffer(ns, max(len(ns), 1))
        params = StoreOpenParams(
            struct_size=ctypes.sizeof(StoreOpenParams), threads=int(threads),
            config_path=os.fsencode(config) if config else None,
            namespace_bytes=ctypes.cast(ns_buf, ctypes.c_void_p), namespace_len=len(ns),
            tenant=tn, max_value_bytes=int(max_value_bytes), event_capacity=int(event_capacity))
        out = _S()
        err = ctypes.create_string_buffer(1024)
        st = api.open(ctypes.byref(params), ctypes.byref(out), err, len(err))
        if st != OK:
            raise StoreError("open", st, err.value.decode(errors="replace"))
        self._s = out
        self.namespace = ns
        self.tenant = tn
        # ticket -> (number of keys, what its buffers point into), until wait collects it
        self._cond = threading.Condition(threading.Lock())
        self._pending = {}
        self._submitting = 0
        self._regions = {}  # region -> the object registered, kept until unregister_memory

    # -- plumbing --

    def _store(self, hook):
        s = self._s
        if not s:
            raise StoreError(hook, ESTATE, "the store is closed")
        return s

    def _check(self, st, hook):
        if st != OK:
            raise StoreError(hook, st, self.last_error())

    @property
    def closed(self):
        return not self._s

    def last_error(self):
        """The calling thread's last error on this store ("" if none)."""
        s = self._s
        if not s:
            return ""
        msg = self._api.last_error(s)
        return msg.decode(errors="replace") if msg else ""

    def close(self):
        """Wait for the batches in flight and close the tiers (their tickets are dropped).
        Idempotent; no other call on this store may run at the same time."""
        s, self._s = self._s, None
        if s:
            self._api.close(s)
            with self._cond:
                self._pending.clear()
                self._cond.notify_all()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        # A batch in flight writes into buffers this object keeps alive: close (which waits for it)
        # before they can go.
        try:
            self.close()
        except Exception:
            pass

    # -- memory --

    def register_memory(self, addr, length=None, kind="host", device=0):
        """Register memory batches will use; addr is an address (length then required) or a buffer
        object. kind: "host", "cuda" or STORE_MEM_*. Returns the region's id."""
        keep = []
        mem = _KINDS[kind] if isinstance(kind, str) else int(kind)
        if not isinstance(addr, int):
            addr, n = _piece(addr, False, keep, host_only=mem == STORE_MEM_HOST)
            if length is None:
                length = n
        if length is None:
            raise ValueError("register_memory needs a length with an address")
        region = ctypes.c_uint64(0)
        self._check(self._api.register_memory(self._store("register_memory"),
                                              ctypes.c_void_p(addr or None), int(length), mem,
                                              int(device), ctypes.byref(region)),
                    "register_memory")
        with self._cond:
            self._regions[int(region.value)] = keep
        return int(region.value)

    def unregister_memory(self, region):
        self._check(self._api.unregister_memory(self._store("unregister_memory"), int(region)),
                    "unregister_memory")
        with self._cond:
            self._regions.pop(int(region), None)

    # -- at once --

    def exists(self, keys, pin_ms=0, local=False, all=False):
        """(n_leading, states): the length of the leading run of present keys, and the states
        (ABSENT, PRESENT, UNKNOWN) the library answered: every key's with all=True, else those up
        to the first absent key. pin_ms > 0 pins the leading run for that long (unpin ends it)."""
        k = _Keys(keys)
        states = (ctypes.c_uint8 * max(k.n, 1))(*([_UNFILLED] * max(k.n, 1)))
        n_leading = ctypes.c_uint64(0)
        flags = (STORE_LOCAL if local else 0) | (STORE_ALL if all else 0)
        self._check(self._api.exists(self._store("exists"), ctypes.byref(k.struct), flags,
                                     int(pin_ms), states, ctypes.byref(n_leading)), "exists")
        out = list(states[:k.n])
        if not all:
            end = out.index(_UNFILLED) if _UNFILLED in out else len(out)
            out = out[:end]
        return int(n_leading.value), out

    def unpin(self, keys):
        k = _Keys(keys)
        self._check(self._api.unpin(self._store("unpin"), ctypes.byref(k.struct)), "unpin")

    # -- batches --

    def _submit(self, op, keys, bufs, flags, hook, writable=False):
        s = self._store(hook)
        k = _Keys(keys)
        sg = _Sg(bufs, k.n, writable) if bufs is not None else None
        ticket = ctypes.c_uint64(0)
        st = EINVAL
        with self._cond:
            self._submitting += 1
        try:
            st = self._api.submit(s, op, ctypes.byref(k.struct),
                                  ctypes.byref(sg.struct) if sg is not None else None, flags,
                                  ctypes.byref(ticket))
            err = self.last_error() if st != OK else ""
        finally:
            with self._cond:
                self._submitting -= 1
                if st == OK:
                    self._pending[int(ticket.value)] = (k.n, sg)
                self._cond.notify_all()
        if st != OK:
            raise StoreError(hook, st, err)
        return int(ticket.value)

    def submit_get(self, keys, bufs):
        """Start reading keys' values into bufs (writable); returns the ticket."""
        return self._submit(STORE_OP_GET, keys, bufs, 0, "submit_get", writable=True)

    def submit_put(self, keys, bufs, overwrite=False):
        """Start storing bufs' bytes under keys; a present key is skipped (Result.flags & SKIPPED)
        unless overwrite. Returns the ticket."""
        return self._submit(STORE_OP_PUT, keys, bufs, STORE_OVERWRITE if overwrite else 0,
                            "submit_put")

    def submit_exists(self, keys):
        """Start asking which keys are stored: each key's result is OK (present) or ENOTFOUND."""
        return self._submit(STORE_OP_EXISTS, keys, None, 0, "submit_exists")

    def submit_remove(self, keys):
        return self._submit(STORE_OP_REMOVE, keys, None, 0, "submit_remove")

    def wait(self, ticket, timeout_ms=None):
        """Collect a ticket: a list of Result, one per key, in the batch's order. timeout_ms None
        waits without bound; StoreTimeout (a TimeoutError) when the batch is not done in time: the
        ticket and its buffers are kept, collect it with wait(e.ticket)."""
        s = self._store("wait")
        ticket = int(ticket)
        with self._cond:
            # A ticket drain handed to another thread while its submit had not recorded it yet.
            while ticket not in self._pending and self._submitting and self._s:
                self._cond.wait()
            entry = self._pending.get(ticket)
        n = entry[0] if entry else 0
        results = (StoreResult * max(n, 1))()
        n_failed = ctypes.c_uint64(0)
        tmo = _NO_BOUND if timeout_ms is None else max(int(timeout_ms), 0)
        st = self._api.wait(s, ticket, tmo, results if n else None, n, ctypes.byref(n_failed))
        if st == ETIMEDOUT:
            raise StoreTimeout(ticket, timeout_ms)
        if st != OK:
            raise StoreError("wait", st, self.last_error())
        with self._cond:
            self._pending.pop(ticket, None)
        return [Result(int(r.status), int(r.tier), int(r.flags), int(r.bytes))
                for r in results[:n]]

    def get(self, keys, bufs, timeout_ms=None):
        """submit_get then wait. With timeout_ms, StoreTimeout when the batch is not done in time:
        bufs are still being written; collect it with wait(e.ticket) before reusing them."""
        return self.wait(self.submit_get(keys, bufs), timeout_ms)

    def put(self, keys, bufs, overwrite=False, timeout_ms=None):
        """submit_put then wait. With timeout_ms, StoreTimeout when the batch is not done in time:
        bufs are still being read; collect it with wait(e.ticket) before changing them."""
        return self.wait(self.submit_put(keys, bufs, overwrite), timeout_ms)

    def remove(self, keys, timeout_ms=None):
        """submit_remove then wait; StoreTimeout as for get (collect it with wait(e.ticket))."""
        return self.wait(self.submit_remove(keys), timeout_ms)

    def event_fd(self):
        """An eventfd that becomes readable when a batch completes (reading it resets it); the
        store owns it."""
        return int(self._api.event_fd(self._store("event_fd")))

    def drain(self, cap=1024):
        """Tickets completed and not drained or collected before, oldest submitted first (collect
        each with wait(t, 0))."""
        s = self._store("drain")
        out = []
        buf = (ctypes.c_uint64 * cap)()
        while True:
            n = ctypes.c_uint64(0)
            self._check(self._api.drain(s, buf, cap, ctypes.byref(n)), "drain")
            got = min(int(n.value), cap)
            out += [int(t) for t in buf[:got]]
            if got < cap:
                return out

    # -- what the store holds --

    def usage(self, cap=64):
        """The tiers of the chain with this store's traffic in each: a list of TierUsage."""
        arr = (StoreTierUsage * cap)()
        for u in arr:
            u.struct_size = ctypes.sizeof(StoreTierUsage)
        n = ctypes.c_uint32(0)
        self._check(self._api.usage(self._store("usage"), arr, cap, ctypes.byref(n)), "usage")
        return [TierUsage(int(u.tier), u.name.decode(errors="replace"), int(u.objects),
                          int(u.bytes), int(u.capacity), int(u.hits), int(u.hit_bytes),
                          int(u.puts), int(u.put_bytes)) for u in arr[:min(int(n.value), cap)]]

    def stats(self):
        """The store's counters (kvs_store_stats) as a dict of ints."""
        out = StoreStats(struct_size=ctypes.sizeof(StoreStats))
        self._check(self._api.stats(self._store("stats"), ctypes.byref(out)), "stats")
        return {name: int(getattr(out, name)) for name, _t in StoreStats._fields_
                if name != "struct_size"}

    def take_events(self, cap=64 << 10):
        """The cache events kept since the last call (event_capacity > 0 at open): a list of
        Event(kind, tier, key16, key), key the engine's bytes or None for a key another store put."""
        s = self._store("take_events")
        events = []
        while True:
            buf = ctypes.create_string_buffer(cap)
            length = ctypes.c_uint64(0)
            n = ctypes.c_uint64(0)
            st = self._api.take_events(s, buf, cap, ctypes.byref(length), ctypes.byref(n))
            if st == EOVERFLOW and n.value == 0:
                cap *= 2  # not even the first record fits
                if cap > (1 << 30):
                    self._check(st, "take_events")
                continue
            self._check(st, "take_events")
            if n.value == 0:
                return events
            raw = buf.raw[:length.value]
            off = 0
            for _ in range(int(n.value)):
                h = StoreEventHeader.from_buffer_copy(raw, off)
                start = off + STORE_EVENT_BYTES
                key = raw[start:start + h.key_len] if h.key_len else None
                events.append(Event(int(h.kind), int(h.tier), bytes(h.key16), key))
                off = (start + h.key_len + 7) & ~7


__all__ = ["Store", "StoreError", "StoreTimeout", "Result", "TierUsage", "Event", "ABSENT",
           "PRESENT", "UNKNOWN", "SKIPPED", "NO_TIER", "get_store_api"]
