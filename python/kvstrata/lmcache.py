"""LMCache adapters over kvstrata's store API (kvstrata.store).

Two ways in, one per generation of LMCache (docs/engines/lmcache.md has the configuration):

- KvstrataNativeConnector: a native plugin of LMCache's multi-process mode. LMCache's L2 adapter
  "native_plugin" imports a module and a class, builds the class with the adapter's parameters as
  keyword arguments and drives it through event_fd, submit_batch_get/set/exists/delete and
  drain_completions:

    --l2-adapter '{"type":"native_plugin","module_path":"kvstrata.lmcache",
                   "class_name":"KvstrataNativeConnector",
                   "adapter_params":{"config":"/etc/kvs/lmcache.yaml","namespace":"bf16-256",
                                     "max_value_bytes":33554432}}'

- KvstrataRemoteConnector: an LMCache RemoteConnector for releases that load third-party remote
  storage through remote_storage_plugins (KvstrataConnectorAdapter, URL scheme kvstrata://) or an
  external:// URL.

Both hand kvstrata the caller's buffers (LMCache's memory objects) without a copy: the store reads
and writes them in place, verifies every object before a byte reaches them, and removes one that
fails its check.
"""

import asyncio
import logging
import select
import struct
import threading
import time
from urllib.parse import parse_qs, urlparse

from kvstrata._recent import RecentKeys

try:  # the real classes where LMCache is installed
    from lmcache.v1.storage_backend.connector import (  # noqa: F401
        ConnectorAdapter,
        ConnectorContext,
    )
    from lmcache.v1.storage_backend.connector.base_connector import RemoteConnector

    HAVE_LMCACHE = True
except Exception:  # noqa: BLE001 - any failure to import LMCache means: not usable here
    from kvstrata._lmcache_standin import (  # noqa: F401
        ConnectorAdapter,
        ConnectorContext,
        RemoteConnector,
    )

    HAVE_LMCACHE = False

log = logging.getLogger("kvstrata.lmcache")

_OK = 0
_ENOTFOUND = -3
_ECORRUPT = -10

_EINVAL = -1

_GET, _SET, _EXISTS, _DELETE = "get", "set", "exists", "delete"

# The largest chunk when neither the configuration nor LMCache's metadata says: a 256-token chunk of
# a model of up to 256 KiB of KV per token (Llama-3-8B in bf16 is 128 KiB, a 32 MiB chunk;
# Qwen2.5-32B is 256 KiB). A DRAM tier gives every object a slab of this size, so a deployment
# should set the engine's own chunk bytes.
DEFAULT_MAX_VALUE_BYTES = 64 << 20
_WARN_EVERY_S = 30.0


def _store_module():
    # Imported on first use so that importing this module (LMCache's plugin discovery does) never
    # loads the library.
    from kvstrata import store

    return store


def _key_bytes(key):
    if isinstance(key, bytes):
        return key
    if isinstance(key, str):
        return key.encode("utf-8")
    raise TypeError("a key is str or bytes, not %s" % type(key).__name__)


def _nbytes(buf):
    with memoryview(buf) as mv:
        return mv.nbytes


def _reset_eventfd(fd):
    """Read the store's eventfd if it is readable, so that a poll on it sleeps until the next
    completion; never blocks."""
    try:
        readable, _, _ = select.select([fd], [], [], 0)
        if readable:
            import os

            os.read(fd, 8)
    except (BlockingIOError, InterruptedError):
        pass


def _status_text(status):
    names = {-1: "EINVAL", -2: "ENOMEM", -3: "ENOTFOUND", -4: "EIO", -7: "ESTATE", -8: "ETIMEDOUT",
             -9: "ENOTSUP", -10: "ECORRUPT", -11: "EAGAIN", -12: "EOVERFLOW"}
    return names.get(status, "status %d" % status)


def _open_store(config, namespace, tenant, threads, max_value_bytes):
    s = _store_module()
    return s.Store(namespace, tenant=tenant or None, config=config or None, threads=int(threads),
                   max_value_bytes=int(max_value_bytes))


def _limit(value, what):
    value = int(value)
    if value < 0:
        raise ValueError("%s must be a positive byte count, not %d" % (what, value))
    return value


class _TooLarge:
    """Says, at most every _WARN_EVERY_S, that values were refused for being larger than the
    store's max_value_bytes: every set of such a chunk fails, so the log must say why."""

    def __init__(self, limit, setting):
        self.limit = limit
        self.setting = setting
        self._lock = threading.Lock()
        self._last = None
        self._quiet = 0
        self.refused = 0

    def text(self, nbytes):
        return ("a chunk of %d bytes is larger than max_value_bytes (%d); set %s to the engine's "
                "chunk bytes" % (nbytes, self.limit, self.setting))

    def note(self, count, nbytes):
        now = time.monotonic()
        with self._lock:
            self.refused += count
            if self._last is not None and now - self._last < _WARN_EVERY_S:
                self._quiet += count
                return
            quiet, self._quiet, self._last = self._quiet, 0, now
        log.warning("kvstrata: %d chunks not stored: %s%s", count, self.text(nbytes),
                    " (%d more since the last report)" % quiet if quiet else "")


class KvstrataNativeConnector:
    """LMCache's native connector contract over one kvstrata store.

    Keys are LMCache's object-key strings (model name, KV rank, object group, chunk hash, optional
    cache salt); they carry the model but not the KV layout, so `namespace` must name what the
    keys leave out (dtype, chunk size, KV format): two deployments that differ there must not share
    a namespace. `tenant` keeps a tenant's objects apart from every other tenant's in the same
    tiers. `config` is a kvstrata YAML file (None: one private 1 GiB DRAM tier).

    `max_value_bytes` is the largest chunk the store takes (0: DEFAULT_MAX_VALUE_BYTES, a 256-token
    chunk of a model of up to 256 KiB of KV per token). Set it to the engine's chunk bytes: a DRAM
    tier gives every object a slab of this size, and every server sharing a tier must open it with
    the same value. A set of a larger chunk fails for that key, and the log says why.

    Every submit_* returns the store's ticket as LMCache's future id. drain_completions returns
    (future_id, ok, error, per_key) tuples for the batches completed since the last call:
    - get: per_key[i] is True when key i's value, verified, filled buffer i exactly; a miss, a
      damaged object (which the store has removed) or a value of another length is False;
    - set: per_key[i] is True when key i is stored (or already was); ok is False when any failed;
    - exists: per_key[i] is True when key i is stored in some tier;
    - delete: per_key[i] is True when key i was removed, False when it was not there (its
      presence is read from the tiers' indexes when the delete is submitted).
    """

    def __init__(self, config=None, namespace="lmcache", tenant=None, threads=0,
                 max_value_bytes=0, overwrite=False):
        limit = _limit(max_value_bytes or DEFAULT_MAX_VALUE_BYTES, "max_value_bytes")
        self.max_value_bytes = limit
        self._too_large = _TooLarge(limit, "adapter_params max_value_bytes")
        self._store = _open_store(config, namespace, tenant, threads, limit)
        self._fd = self._store.event_fd()
        self._overwrite = bool(overwrite)
        # ticket -> (op, number of keys, buffers); the buffers stay referenced until LMCache has
        # the completion, the store holds them until the ticket is collected
        self._ops = {}
        self._lock = threading.Lock()
        self._closed = False

    def event_fd(self):
        return self._fd

    def _submit(self, op, keys, bufs=None):
        keys = [_key_bytes(k) for k in keys]
        if not keys:
            raise ValueError("keys list is empty")
        if bufs is not None:
            bufs = list(bufs)
            if len(bufs) != len(keys):
                raise ValueError("keys and memoryviews size mismatch")
        with self._lock:
            if self._closed:
                raise RuntimeError("the kvstrata connector is closed")
            if op == _GET:
                ticket = self._store.submit_get(keys, bufs)
            elif op == _SET:
                ticket = self._store.submit_put(keys, bufs, overwrite=self._overwrite)
            elif op == _EXISTS:
                ticket = self._store.submit_exists(keys)
            else:
                # a remove of an absent key succeeds; LMCache wants to know it was not there
                _, present = self._store.exists(keys, local=True, all=True)
                bufs = [st != _store_module().ABSENT for st in present]
                ticket = self._store.submit_remove(keys)
            self._ops[int(ticket)] = (op, len(keys), bufs)
        return int(ticket)

    def submit_batch_get(self, keys, memoryviews):
        return self._submit(_GET, keys, memoryviews)

    def submit_batch_set(self, keys, memoryviews):
        return self._submit(_SET, keys, memoryviews)

    def submit_batch_exists(self, keys):
        return self._submit(_EXISTS, keys)

    def submit_batch_delete(self, keys):
        return self._submit(_DELETE, keys)

    def drain_completions(self):
        out = []
        with self._lock:
            if self._closed:
                return out
            _reset_eventfd(self._fd)
            while True:
                tickets = self._store.drain()
                if not tickets:
                    break
                for t in tickets:
                    entry = self._ops.pop(int(t), None)
                    if entry is None:
                        continue  # not submitted through this object
                    out.append(self._translate(int(t), entry, self._store.wait(t, 0)))
        return out

    def _translate(self, ticket, entry, results):
        op, n, bufs = entry
        if len(results) != n:
            return (ticket, False, "kvstrata returned %d results for %d keys" % (len(results), n),
                    None)
        if op == _GET:
            per_key = [r.status == _OK and r.bytes == _nbytes(b) for r, b in zip(results, bufs)]
            return (ticket, True, "", per_key)
        if op == _SET:
            per_key = [r.status == _OK for r in results]
            failed = [i for i, ok in enumerate(per_key) if not ok]
            error = ""
            if failed:
                error = "%d of %d keys not stored (first: key %d, %s)" % (
                    len(failed), n, failed[0], _status_text(results[failed[0]].status))
                big = [i for i in failed if results[i].status == _EINVAL
                       and _nbytes(bufs[i]) > self.max_value_bytes]
                if big:
                    largest = max(_nbytes(bufs[i]) for i in big)
                    self._too_large.note(len(big), largest)
                    error += "; " + self._too_large.text(largest)
            return (ticket, not failed, error, per_key)
        if op == _DELETE:
            per_key = [r.status == _OK and was for r, was in zip(results, bufs)]
            return (ticket, True, "", per_key)
        per_key = [r.status == _OK for r in results]
        return (ticket, True, "", per_key)

    def close(self):
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._ops.clear()
        self._store.close()


# --- LMCache's RemoteConnector (releases before the multi-process mode) -----------------------

# A chunk is two objects: its bytes under the engine's key string and a header under the same key
# with _META_SUFFIX. The header lets a get allocate the memory object (shape, dtype, format) before
# the bytes land in it, so they are read in place.
_META_SUFFIX = b"\x00kvs-meta"
_META = struct.Struct("<8sIIQ24s8q")
_META_MAGIC = b"KVSLMC01"
_MAX_DIMS = 8


def _dtype_name(dtype):
    return str(dtype).replace("torch.", "")


def _dtype_from_name(name):
    import torch

    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError("unknown dtype %r in a stored header" % name)
    return dtype


def _memory_format(value):
    if HAVE_LMCACHE:
        from lmcache.v1.memory_management import MemoryFormat

        return MemoryFormat(value)
    return value


def _pack_meta(memory_obj, nbytes):
    shape = [int(d) for d in memory_obj.get_shape()]
    if len(shape) > _MAX_DIMS:
        raise ValueError("a memory object of %d dimensions" % len(shape))
    name = _dtype_name(memory_obj.get_dtype()).encode("ascii")
    return _META.pack(_META_MAGIC, int(memory_obj.get_memory_format()), len(shape), nbytes, name,
                      *(shape + [0] * (_MAX_DIMS - len(shape))))


def _unpack_meta(raw):
    magic, fmt, ndim, nbytes, name, *dims = _META.unpack(bytes(raw))
    if magic != _META_MAGIC or ndim > _MAX_DIMS:
        raise ValueError("not a kvstrata LMCache header")
    return fmt, tuple(dims[:ndim]), nbytes, name.rstrip(b"\x00").decode("ascii")


class KvstrataRemoteConnector(RemoteConnector):
    """LMCache's RemoteConnector over one kvstrata store.

    Keys are CacheEngineKey.to_string() (model name, world size, worker id, chunk hash, KV dtype
    and request tags); the namespace adds what the key leaves out: LMCache's KV shape and chunk
    size where its metadata gives them, else the string given. Gets allocate from LMCache's local
    CPU backend and read into the memory object in place; a miss or a damaged object is None (the
    store removes a damaged object; its header is removed with it).

    list() answers the keys this connector stored and did not remove: kvstrata finds objects by
    key and cannot enumerate a tier.

    The store's max_value_bytes (the largest chunk) is, unless given, one whole chunk of LMCache's
    metadata: kv_shape (with chunk_size) times the bytes of kv_dtype, rounded up to 4 KiB; without
    metadata, DEFAULT_MAX_VALUE_BYTES. A put of a larger chunk fails, and says why.
    """

    def __init__(self, url=None, loop=None, local_cpu_backend=None, config=None, metadata=None,
                 store_config=None, tenant=None, namespace=None, threads=0, max_value_bytes=0,
                 pin_ms=10000):
        params = _url_params(url)
        extra = getattr(config, "extra_config", None) or {}
        store_config = store_config or params.get("config") or extra.get("kvstrata.config")
        tenant = tenant or params.get("tenant") or extra.get("kvstrata.tenant")
        namespace = namespace or params.get("namespace") or extra.get("kvstrata.namespace")
        max_value_bytes = _limit(max_value_bytes or params.get("max_value_bytes")
                                 or extra.get("kvstrata.max_value_bytes")
                                 or chunk_bytes_from_metadata(metadata)
                                 or DEFAULT_MAX_VALUE_BYTES, "max_value_bytes")
        if not namespace:
            namespace = _namespace_from_metadata(metadata)
        self.loop = loop
        self.local_cpu_backend = local_cpu_backend
        self._pin_ms = int(pin_ms)
        self.max_value_bytes = max_value_bytes
        self._too_large = _TooLarge(max_value_bytes, "kvstrata.max_value_bytes (or the URL's "
                                    "max_value_bytes)")
        self._store = _open_store(store_config, namespace, tenant, threads, max_value_bytes)
        self._fd = self._store.event_fd()
        self._futures = {}  # ticket -> asyncio future, on self._waiter_loop only
        self._waiter_loop = None
        # key strings this connector put and did not remove (the last million)
        self._stored = RecentKeys()
        self._stored_lock = threading.Lock()
        self._closed = False

    # completions: the store's eventfd is watched by the event loop LMCache runs connectors on, so
    # an awaiting coroutine holds no thread

    def _on_ready(self):
        _reset_eventfd(self._fd)
        while True:
            tickets = self._store.drain()
            if not tickets:
                return
            for t in tickets:
                fut = self._futures.pop(int(t), None)
                if fut is None:
                    continue  # a synchronous call's ticket: that call collects it
                try:
                    results = self._store.wait(t, 0)
                except Exception as e:  # noqa: BLE001 - handed to the awaiting coroutine
                    if not fut.done():
                        fut.set_exception(e)
                    continue
                if not fut.done():
                    fut.set_result(results)

    async def _wait(self, ticket):
        loop = asyncio.get_running_loop()
        if self._waiter_loop is None:
            self._waiter_loop = loop
            loop.add_reader(self._fd, self._on_ready)
        if loop is not self._waiter_loop:
            return await loop.run_in_executor(None, self._store.wait, ticket)
        fut = loop.create_future()
        self._futures[int(ticket)] = fut
        self._on_ready()  # it may have completed before the reader was armed
        return await fut

    @staticmethod
    def _pairs(keys):
        out = []
        for k in keys:
            body = _key_bytes(k.to_string())
            out += [body + _META_SUFFIX, body]
        return out

    def _remember(self, keys, stored):
        with self._stored_lock:
            for k, ok in zip(keys, stored):
                if ok:
                    self._stored.add(k.to_string())

    def _forget(self, keys):
        with self._stored_lock:
            for k in keys:
                self._stored.discard(k.to_string())

    # exists

    def _leading(self, keys, pin_ms=0):
        if not keys:
            return 0
        n, _ = self._store.exists(self._pairs(keys), pin_ms=pin_ms)
        return n // 2

    async def exists(self, key):
        return self._leading([key]) == 1

    def exists_sync(self, key):
        return self._leading([key]) == 1

    def support_batched_contains(self):
        return True

    def batched_contains(self, keys, stop_after_first_not_exits=True):
        if not keys:
            return []
        if stop_after_first_not_exits:
            n = self._leading(keys)
            return [i < n for i in range(len(keys))]
        _, states = self._store.exists(self._pairs(keys), all=True)
        present = _store_module().PRESENT
        return [states[2 * i] == present and states[2 * i + 1] == present
                for i in range(len(keys))]

    def support_batched_async_contains(self):
        return True

    async def batched_async_contains(self, lookup_id, keys, pin=False):
        return self._leading(keys, self._pin_ms if pin else 0)

    # put

    async def put(self, key, memory_obj):
        await self.batched_put([key], [memory_obj])

    def support_batched_put(self):
        return True

    async def batched_put(self, keys, memory_objs):
        if not keys:
            return
        bufs = []
        for obj in memory_objs:
            body = obj.byte_array
            bufs += [_pack_meta(obj, _nbytes(body)), body]
        # one batch: a chunk counts as stored only when its header and its bytes both are
        results = await self._wait(self._store.submit_put(self._pairs(keys), bufs))
        stored = [results[2 * i].status == _OK and results[2 * i + 1].status == _OK
                  for i in range(len(keys))]
        self._remember(keys, stored)
        failed = [i for i, ok in enumerate(stored) if not ok]
        if failed:
            i = failed[0]
            bad = results[2 * i] if results[2 * i].status != _OK else results[2 * i + 1]
            why = _status_text(bad.status)
            big = [j for j in failed if results[2 * j + 1].status == _EINVAL
                   and _nbytes(bufs[2 * j + 1]) > self.max_value_bytes]
            if big:
                largest = max(_nbytes(bufs[2 * j + 1]) for j in big)
                self._too_large.note(len(big), largest)
                why += "; " + self._too_large.text(largest)
            raise RuntimeError("kvstrata: %d of %d chunks not stored (first %s: %s)" % (
                len(failed), len(keys), keys[i].to_string(), why))

    # get

    async def get(self, key):
        return (await self.batched_get([key]))[0]

    def support_batched_get(self):
        return True

    async def batched_get(self, keys):
        if not keys:
            return []
        bodies = [_key_bytes(k.to_string()) for k in keys]
        heads = [bytearray(_META.size) for _ in keys]
        results = await self._wait(self._store.submit_get([b + _META_SUFFIX for b in bodies], heads))
        objs = [None] * len(keys)
        want = []
        for i, (r, head) in enumerate(zip(results, heads)):
            if r.status != _OK or r.bytes != _META.size:
                continue
            try:
                fmt, shape, nbytes, dtype = _unpack_meta(head)
                obj = self.local_cpu_backend.allocate(shape, _dtype_from_name(dtype),
                                                      _memory_format(fmt))
            except Exception as e:  # noqa: BLE001 - a header this process cannot use is a miss
                log.warning("kvstrata: header of %s unusable: %s", keys[i].to_string(), e)
                continue
            if obj is None:
                log.warning("kvstrata: no memory for %s", keys[i].to_string())
                continue
            if _nbytes(obj.byte_array) != nbytes:
                obj.ref_count_down()
                continue
            objs[i] = obj
            want.append(i)
        if not want:
            return objs
        results = await self._wait(self._store.submit_get([bodies[i] for i in want],
                                                          [objs[i].byte_array for i in want]))
        damaged = []
        for i, r in zip(want, results):
            if r.status == _OK and r.bytes == _nbytes(objs[i].byte_array):
                continue
            if r.status == _ECORRUPT:
                damaged.append(keys[i])
            objs[i].ref_count_down()
            objs[i] = None
        if damaged:
            # the store removed each damaged value; its header goes too, so exists says absent
            await self._wait(self._store.submit_remove(
                [_key_bytes(k.to_string()) + _META_SUFFIX for k in damaged]))
            self._forget(damaged)
        return objs

    def support_batched_get_non_blocking(self):
        return True

    async def batched_get_non_blocking(self, lookup_id, keys):
        objs = await self.batched_get(keys)
        out = []
        for i, obj in enumerate(objs):
            if obj is None:
                for later in objs[i + 1:]:
                    if later is not None:
                        later.ref_count_down()
                break
            out.append(obj)
        return out

    # remove, list, close

    def remove_sync(self, key):
        pair = self._pairs([key])
        _, present = self._store.exists(pair, local=True, all=True)
        results = self._store.remove(pair)
        self._forget([key])
        return present[1] != _store_module().ABSENT and results[1].status == _OK

    async def list(self):
        with self._stored_lock:
            return sorted(self._stored)

    async def close(self):
        if self._closed:
            return
        self._closed = True
        if self._waiter_loop is not None:
            self._waiter_loop.remove_reader(self._fd)
        self._store.close()
        for fut in self._futures.values():
            if not fut.done():
                fut.cancel()
        self._futures.clear()

    def __repr__(self):
        return "<KvstrataRemoteConnector>"


def _url_params(url):
    """kvstrata://[anything]/?config=PATH&tenant=T&namespace=N&max_value_bytes=B"""
    if not url or "://" not in url:
        return {}
    q = parse_qs(urlparse(url).query)
    return {k: v[0] for k, v in q.items() if v}


def _dtype_bytes(dtype):
    size = getattr(dtype, "itemsize", None)
    if isinstance(size, int) and size > 0:
        return size
    import torch

    if isinstance(dtype, str):
        dtype = _dtype_from_name(dtype.replace("torch.", ""))
    return torch.tensor([], dtype=dtype).element_size()


def chunk_bytes_from_metadata(metadata):
    """Bytes of one whole chunk as LMCache's metadata describes it: kv_shape (num_layer, 2 or 1 for
    MLA, chunk_size, num_kv_head, head_size), its chunk dimension replaced by metadata.chunk_size
    where that is given, times the bytes of kv_dtype; rounded up to 4 KiB. 0 when the metadata does
    not say."""
    shape = getattr(metadata, "kv_shape", None)
    dtype = getattr(metadata, "kv_dtype", None)
    if not shape or dtype is None:
        return 0
    try:
        dims = [int(d) for d in shape]
        chunk = getattr(metadata, "chunk_size", None)
        if chunk and len(dims) == 5:
            dims[2] = int(chunk)
        n = _dtype_bytes(dtype)
        for d in dims:
            n *= d
    except (TypeError, ValueError) as e:
        log.warning("kvstrata: LMCache's metadata gives no usable chunk size (%s)", e)
        return 0
    return (max(n, _META.size) + 4095) // 4096 * 4096


def _namespace_from_metadata(metadata):
    parts = ["lmcache"]
    for name in ("kv_shape", "chunk_size", "use_mla"):
        value = getattr(metadata, name, None)
        if value is not None:
            parts.append("%s=%s" % (name, tuple(value) if name == "kv_shape" else value))
    return "/".join(parts)


class KvstrataConnectorAdapter(ConnectorAdapter):
    """Makes kvstrata:// remote URLs of LMCache's remote storage plugin framework open
    KvstrataRemoteConnector (extra_config: remote_storage_plugin.<name>.module_path/class_name)."""

    def __init__(self):
        super().__init__("kvstrata://")

    def create_connector(self, context):
        return KvstrataRemoteConnector(url=context.url, loop=context.loop,
                                       local_cpu_backend=context.local_cpu_backend,
                                       config=context.config,
                                       metadata=getattr(context, "metadata", None))
