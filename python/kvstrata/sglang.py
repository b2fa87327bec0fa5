"""KvstrataHiCacheStorage: an SGLang HiCache storage backend (L3) over kvstrata's store API.

Enable it with
  --enable-hierarchical-cache --hicache-storage-backend dynamic
  --hicache-storage-backend-extra-config '{"backend_name":"kvstrata","module_path":"kvstrata.sglang",
    "class_name":"KvstrataHiCacheStorage","interface_v1":1,"config":"/etc/kvs/sglang.yaml"}'

SGLang builds one instance in each scheduler process (one per TP rank) through its storage backend
factory, hands it the host KV pool (register_mem_pool_host), then calls it from its storage threads:
batch_exists from the prefetch thread, batch_get_v1 (or batch_get) from the prefetch I/O thread,
batch_set_v1 (or batch_set) from the backup thread, all at once. Each instance opens its own
kvstrata store; every call goes to the store, whose calls may come from any thread.

One SGLang page is one store object under SGLang's own page key (the hash of the page's tokens
and its prefix). With interface_v1 the object is the page's segments of the host pool as
get_page_buffer_meta lists them, concatenated (layer_first: each layer's K and V; page_first: the
page's K and V runs), moved straight between the host pool and the store's tiers. The store's
namespace is the model, the pool's dtype, page size, layout and bytes per token, the I/O path, and
the TP rank and size except for MLA models (whose KV every rank holds whole), so pages of two
layouts, two ranks or two models never meet. docs/engines/sglang.md describes the configuration.
"""

import logging
import os
import threading
import time

from kvstrata._recent import RecentKeys

try:  # SGLang's own classes when SGLang is installed, so its factory's issubclass check holds
    from sglang.srt.mem_cache.hicache_storage import (  # type: ignore
        HiCacheStorage,
        HiCacheStorageConfig,
        HiCacheStorageExtraInfo,
    )

    HAVE_SGLANG = True
except ImportError:
    from kvstrata._sglang_standin import (  # noqa: F401 - re-exported
        HiCacheStorage,
        HiCacheStorageConfig,
        HiCacheStorageExtraInfo,
    )

    HAVE_SGLANG = False

_log = logging.getLogger("kvstrata")

__all__ = ["KvstrataHiCacheStorage", "HAVE_SGLANG", "namespace_for"]

NAMESPACE_VERSION = 1
_BATCH_MAX = 65536  # KVS_STORE_BATCH_MAX: keys in one store call
_WARN_EVERY_S = 30.0  # a failing store logs each call's failure at most this often
_REOPEN_AFTER_S = 10.0  # a store that failed to open is tried again after this long


def _opt(extra, name, env, default=None):
    """extra_config's `name`, else the environment's `env`, else `default`."""
    if extra and extra.get(name) not in (None, ""):
        return extra[name]
    value = os.environ.get(env)
    return value if value not in (None, "") else default


def _truthy(value):
    return str(value).strip().lower() not in ("", "0", "false", "no", "off")


def namespace_for(config, pool=None, interface_v1=True):
    """The store namespace of a backend with `config` (HiCacheStorageConfig) over host pool `pool`.
    Everything that changes the bytes of a stored page is in it: the model, the pool's dtype, page
    size, layout and bytes per token, the I/O path (v1 segments or generic flat pages), and the
    TP rank and size (not for MLA models: every rank holds the same latent KV), PP rank and size
    and attention-CP rank and size where they are above 1."""
    parts = [f"sglang-hicache/{NAMESPACE_VERSION}", f"model={config.model_name or ''}"]
    if pool is not None:
        parts.append(f"dtype={getattr(pool, 'dtype', '')}")
        parts.append(f"page={getattr(pool, 'page_size', '')}")
        parts.append(f"layout={getattr(pool, 'layout', '')}")
        per_token = getattr(pool, "size_per_token", None)
        if per_token is None and hasattr(pool, "get_size_per_token"):
            per_token = pool.get_size_per_token()
        parts.append(f"token_bytes={per_token if per_token is not None else ''}")
    else:
        parts.append("layout=" + ("page_first" if config.is_page_first_layout else "layer_first"))
    parts.append("io=" + ("v1" if interface_v1 else "flat"))
    if config.is_mla_model:
        parts.append("mla")
    else:
        parts.append(f"tp={config.tp_rank}/{config.tp_size}")
    pp_size = getattr(config, "pp_size", 1) or 1
    if pp_size > 1:
        parts.append(f"pp={getattr(config, 'pp_rank', 0)}/{pp_size}")
    cp_size = getattr(config, "attn_cp_size", 1) or 1
    if cp_size > 1:
        parts.append(f"cp={getattr(config, 'attn_cp_rank', 0)}/{cp_size}")
    return ";".join(parts)


def page_bytes(pool):
    """Bytes of one stored page of host pool `pool` (page_size x size_per_token), or 0 when the
    pool does not say (the library's default limit then applies). Every process of a deployment
    computes the same value, as a DRAM tier shared by processes requires."""
    if pool is None:
        return 0
    per_token = getattr(pool, "size_per_token", None)
    if per_token is None and hasattr(pool, "get_size_per_token"):
        per_token = pool.get_size_per_token()
    try:
        return int(getattr(pool, "page_size", 0)) * int(per_token or 0)
    except (TypeError, ValueError):
        return 0


def _span(obj, size=None):
    """(address, length, keep) of one buffer SGLang hands over: a tensor (its data_ptr and
    nbytes; it must be contiguous), a numpy array, or an integer address with `size`. `keep` is
    what must stay alive until the store's ticket completes."""
    if isinstance(obj, int):
        if size is None:
            raise ValueError("an address needs a size")
        return obj, int(size), None
    if hasattr(obj, "data_ptr"):  # torch.Tensor
        if obj.device.type != "cpu":
            raise ValueError("a buffer must be in host memory")
        if not obj.is_contiguous():
            raise ValueError("a buffer must be contiguous")
        return obj.data_ptr(), obj.numel() * obj.element_size(), obj
    if hasattr(obj, "ctypes") and hasattr(obj, "nbytes"):  # numpy.ndarray
        if not obj.flags["C_CONTIGUOUS"]:
            raise ValueError("a buffer must be contiguous")
        return obj.ctypes.data, obj.nbytes, obj
    raise TypeError(f"unsupported buffer type {type(obj).__name__}")


class KvstrataHiCacheStorage(HiCacheStorage):
    """SGLang's HiCacheStorage over one kvstrata store.

    SGLang's dynamic loader constructs it as cls(storage_config, kwargs) with kwargs a dict (its
    built-in backends get (storage_config, mem_pool_host) instead; a host pool passed there is
    registered at once). The store opens at register_mem_pool_host, when the pool's dtype, page
    size and layout (part of the namespace) are known; a call before that opens it with the
    configuration's layout alone.

    Configuration: extra_config keys, else environment variables:
      config (KVSTRATA_CONFIG)   the kvstrata YAML (docs/configuration.md); none: a 1 GiB DRAM tier
      tenant (KVSTRATA_TENANT)   the store's tenant: two tenants never see each other's pages
      threads (KVSTRATA_STORE_THREADS)  the store's threads; 0: the library's default
      pin_ms (KVSTRATA_PIN_MS)   batch_exists pins the pages it found this long, so the
                                 batch_get_v1 that follows finds them (0: no pin)
      max_value_bytes (KVSTRATA_MAX_VALUE_BYTES)  the largest page (0: the host pool's page,
                                 page_size x size_per_token); every process sharing a DRAM tier
                                 must open it with one value (each object takes a slab of it)
      interface_v1               SGLang's own switch for the zero-copy v1 calls; it also decides
                                 which of the two page formats this backend stores
    """

    def __init__(self, storage_config, kwargs=None):
        self.storage_config = storage_config
        extra = dict(storage_config.extra_config or {})
        self.extra_config = extra
        self.config_path = _opt(extra, "config", "KVSTRATA_CONFIG")
        self.tenant = _opt(extra, "tenant", "KVSTRATA_TENANT")
        self.threads = int(_opt(extra, "threads", "KVSTRATA_STORE_THREADS", 0))
        self.pin_ms = int(_opt(extra, "pin_ms", "KVSTRATA_PIN_MS", 0))
        self.max_value_bytes = int(_opt(extra, "max_value_bytes", "KVSTRATA_MAX_VALUE_BYTES", 0))
        self.interface_v1 = _truthy(extra.get("interface_v1", 0))
        self.is_mla = bool(storage_config.is_mla_model)
        # MLA: every rank holds the same pages; rank 0 alone writes them (SGLang's controller also
        # skips the backup on other ranks; this holds when it is called anyway)
        self.writes = not (self.is_mla and storage_config.tp_rank != 0)
        self.mem_pool_host = None
        self.namespace = None
        self._store = None
        self._regions = []
        self._lock = threading.Lock()
        self._stored = RecentKeys()  # the last million keys this instance put (clear removes them)
        self.corrupt_pages = 0
        self.store_failures = 0  # calls that failed in the store (each answered as a miss)
        self._warned = {}  # call -> (when it last logged, failures not logged since)
        self._open_error = None  # (when, exception) of the last failed open
        if kwargs is not None and hasattr(kwargs, "get_page_buffer_meta"):
            self.register_mem_pool_host(kwargs)

    # ---- the store ----

    def _open(self, pool):
        from kvstrata.store import Store

        namespace = namespace_for(self.storage_config, pool, self.interface_v1)
        max_value = self.max_value_bytes or page_bytes(pool)
        store = Store(namespace, tenant=self.tenant, config=self.config_path,
                      threads=self.threads, max_value_bytes=max_value)
        self.namespace = namespace
        _log.info("kvstrata HiCache storage: namespace %s, tenant %s, config %s", namespace,
                  self.tenant or "-", self.config_path or "(1 GiB DRAM)")
        return store

    @property
    def store(self):
        """The store, opened on first use when no host pool was registered. A failed open raises
        (its exception again, without a new try, for _REOPEN_AFTER_S)."""
        if self._store is None:
            with self._lock:
                if self._store is None:
                    failed = self._open_error
                    if failed is not None and time.monotonic() - failed[0] < _REOPEN_AFTER_S:
                        raise failed[1]
                    try:
                        self._store = self._open(None)
                    except Exception as e:
                        self._open_error = (time.monotonic(), e)
                        raise
                    self._open_error = None
        return self._store

    def _failed(self, call, n, exc):
        """Note a store failure of `call` over n keys, answered as a miss. SGLang calls this
        backend from its storage threads, which do not catch exceptions (one that escapes ends the
        thread and with it L3 for the process), so nothing is raised; the log says it at most once
        per _WARN_EVERY_S per call, with how many failures it left out."""
        now = time.monotonic()
        with self._lock:
            self.store_failures += 1
            last, quiet = self._warned.get(call, (None, 0))
            if last is not None and now - last < _WARN_EVERY_S:
                self._warned[call] = (last, quiet + 1)
                return
            self._warned[call] = (now, 0)
        more = f" ({quiet} more failures since the last report)" if quiet else ""
        _log.warning("kvstrata HiCache storage: %s of %d pages failed, answered as a miss: %s%s",
                     call, n, exc, more, exc_info=last is None)

    def _unpin(self, keys):
        if self.pin_ms <= 0:
            return
        try:
            for at in range(0, len(keys), _BATCH_MAX):
                self.store.unpin(keys[at:at + _BATCH_MAX])
        except Exception as e:  # the pins run out at pin_ms anyway
            self._failed("unpin", len(keys), e)

    def register_mem_pool_host(self, mem_pool_host):
        """Keep the host pool, open the store under the pool's namespace and register the pool's
        buffer(s) with it (kv_buffer, one tensor or several)."""
        self.mem_pool_host = mem_pool_host
        with self._lock:
            if self._store is None:
                self._store = self._open(mem_pool_host)
            buffers = getattr(mem_pool_host, "kv_buffer", None)
            if buffers is None:
                return
            if not isinstance(buffers, (list, tuple)):
                buffers = [buffers]
            for buf in buffers:
                if buf is None or not hasattr(buf, "data_ptr") or buf.device.type != "cpu":
                    continue
                nbytes = buf.numel() * buf.element_size()
                if nbytes:
                    self._regions.append(self._store.register_memory(buf.data_ptr(), nbytes,
                                                                     kind="host"))

    def close(self):
        """Unregister the pool and close the store (SGLang calls it when it detaches the backend)."""
        with self._lock:
            store, self._store = self._store, None
            regions, self._regions = self._regions, []
        if store is None:
            return
        for region in regions:
            try:
                store.unregister_memory(region)
            except Exception:  # the store closes anyway
                _log.exception("kvstrata HiCache storage: unregister_memory failed")
        store.close()

    def _in_batches(self, submit, keys, bufs):
        """submit (the store's submit_get or submit_put) over keys in batches the store takes,
        waited for in turn: every key's result."""
        results = []
        for at in range(0, len(keys), _BATCH_MAX):
            results.extend(self.store.wait(submit(keys[at:at + _BATCH_MAX],
                                                  bufs[at:at + _BATCH_MAX])))
        return results

    def _note_stored(self, keys, results):
        with self._lock:
            for key, res in zip(keys, results):
                if res.status == 0:
                    self._stored.add(key)

    def _check_gets(self, keys, results, expected):
        """Per-key success of a get batch: the value was found, checked, and has the page's length.
        A failed key's buffers hold undefined bytes (the store checks as it copies): its False makes
        SGLang count only the pages before it. A corrupt object is removed from
        every tier by the store."""
        from kvstrata import _abi_types as t

        ok = []
        for key, res, want in zip(keys, results, expected):
            good = res.status == 0 and res.bytes == want
            if res.status == t.ECORRUPT:
                self.corrupt_pages += 1
                _log.warning("kvstrata HiCache storage: page %s failed its check and was removed",
                             key)
            elif res.status == 0 and res.bytes != want:
                _log.warning("kvstrata HiCache storage: page %s holds %d bytes, not %d", key,
                             res.bytes, want)
            ok.append(good)
        return ok

    # ---- exists ----

    def batch_exists(self, keys, extra_info=None):
        """The number of leading keys that are stored (what SGLang's prefetch thread reduces with
        a MIN over the TP ranks). Each rank answers for its own namespace. A store that fails
        answers the keys counted before it failed (0 when its first call fails)."""
        total = 0
        try:
            for at in range(0, len(keys), _BATCH_MAX):
                chunk = list(keys[at:at + _BATCH_MAX])
                n, _ = self.store.exists(chunk, pin_ms=self.pin_ms)
                total += n
                if n < len(chunk):
                    break
        except Exception as e:
            self._failed("batch_exists", len(keys), e)
        return total

    def exists(self, key):
        try:
            n, _ = self.store.exists([key])
        except Exception as e:
            self._failed("exists", 1, e)
            return False
        return n == 1

    # ---- zero-copy v1 ----

    def _page_segments(self, keys, host_indices):
        """Per key the (address, length) segments of its page in the host pool, from
        get_page_buffer_meta: its flat pointer list holds the same number of segments per page,
        in page order."""
        if self.mem_pool_host is None:
            raise RuntimeError("no host pool registered")
        ptrs, sizes = self.mem_pool_host.get_page_buffer_meta(host_indices)
        if not keys or len(ptrs) % len(keys) or len(ptrs) != len(sizes):
            raise ValueError(f"{len(ptrs)} buffer segments for {len(keys)} pages")
        per = len(ptrs) // len(keys)
        bufs = []
        lengths = []
        for i in range(len(keys)):
            seg = [(int(ptrs[j]), int(sizes[j])) for j in range(i * per, (i + 1) * per)]
            bufs.append(seg)
            lengths.append(sum(n for _, n in seg))
        return bufs, lengths

    def batch_get_v1(self, keys, host_indices, extra_info=None):
        """Read each page into its host-pool slots; per key True when the whole page arrived. A
        miss, a short or a corrupt object is that key's False; its slots then hold undefined
        bytes, and SGLang's controller uses no page from the first False on."""
        keys = list(keys)
        if not keys:
            return []
        try:
            bufs, lengths = self._page_segments(keys, host_indices)
            results = self._in_batches(self.store.submit_get, keys, bufs)
        except Exception as e:
            self._failed("batch_get_v1", len(keys), e)
            self._unpin(keys)
            return [False] * len(keys)
        self._unpin(keys)
        return self._check_gets(keys, results, lengths)

    def batch_set_v1(self, keys, host_indices, extra_info=None):
        """Store each page from its host-pool slots; per key True when it is stored (or was
        already). An MLA rank other than 0 writes nothing and answers True."""
        keys = list(keys)
        if not keys:
            return []
        if not self.writes:
            return [True] * len(keys)
        try:
            bufs, _ = self._page_segments(keys, host_indices)
            results = self._in_batches(self.store.submit_put, keys, bufs)
        except Exception as e:
            self._failed("batch_set_v1", len(keys), e)
            return [False] * len(keys)
        self._note_stored(keys, results)
        return [res.status == 0 for res in results]

    # ---- the generic (copying) path: flat pages as tensors ----

    def _targets(self, keys, locations, sizes):
        spans = []
        for i in range(len(keys)):
            loc = locations[i] if locations is not None else None
            size = sizes[i] if sizes is not None else None
            spans.append(_span(loc, size))
        return spans

    def batch_get(self, keys, target_locations=None, target_sizes=None):
        """Read each page into target_locations[i] (a contiguous host tensor, or an address with
        target_sizes[i]); per key that target, or None where the page is missing or failed."""
        keys = list(keys)
        if not keys:
            return []
        if target_locations is None:
            raise ValueError("kvstrata HiCache storage reads into target_locations")
        try:
            spans = self._targets(keys, target_locations, target_sizes)
            ticket = self.store.submit_get(keys, [(a, n) for a, n, _ in spans])
            results = self.store.wait(ticket)
        except Exception as e:
            self._failed("batch_get", len(keys), e)
            return [None] * len(keys)
        ok = self._check_gets(keys, results, [n for _, n, _ in spans])
        return [target_locations[i] if ok[i] else None for i in range(len(keys))]

    def get(self, key, target_location=None, target_sizes=None):
        sizes = None if target_sizes is None else [target_sizes]
        return self.batch_get([key], [target_location], sizes)[0]

    def batch_set(self, keys, values=None, target_locations=None, target_sizes=None):
        """Store each page from values[i] (a host tensor; a non-contiguous one is copied first),
        or from target_locations[i] with target_sizes[i]. True when every page is stored."""
        keys = list(keys)
        if not keys:
            return True
        if not self.writes:
            return True
        try:
            if values is not None:
                spans = [_span(v.contiguous() if hasattr(v, "contiguous") else v)
                         for v in values]
            else:
                spans = self._targets(keys, target_locations, target_sizes)
            ticket = self.store.submit_put(keys, [(a, n) for a, n, _ in spans])
            results = self.store.wait(ticket)
            del spans  # the copies stay alive until the put completed
        except Exception as e:
            self._failed("batch_set", len(keys), e)
            return False
        self._note_stored(keys, results)
        return all(res.status == 0 for res in results)

    def set(self, key, value=None, target_location=None, target_sizes=None):
        values = None if value is None else [value]
        locations = None if target_location is None else [target_location]
        sizes = None if target_sizes is None else [target_sizes]
        return self.batch_set([key], values, locations, sizes)

    # ---- the rest ----

    def clear(self):
        """Remove the pages this instance stored. The store cannot list a namespace, so pages
        other processes (or an earlier run) stored stay until their tier evicts them; True when
        every page this instance stored is gone."""
        with self._lock:
            keys = sorted(self._stored)
        if not keys:
            return True
        from kvstrata import _abi_types as t

        gone = True
        for at in range(0, len(keys), _BATCH_MAX):
            chunk = keys[at:at + _BATCH_MAX]
            try:
                results = self.store.remove(chunk)
            except Exception as e:
                self._failed("clear", len(chunk), e)
                return False
            for key, res in zip(chunk, results):
                if res.status in (0, t.ENOTFOUND):
                    with self._lock:
                        self._stored.discard(key)
                else:
                    gone = False
        return gone

    def store_stats(self):
        """The store's counters (kvs_store_stats), this adapter's corrupt pages and its store
        failures (calls answered as a miss because the store failed)."""
        stats = dict(self.store.stats())
        stats["adapter_corrupt_pages"] = self.corrupt_pages
        stats["adapter_store_failures"] = self.store_failures
        return stats
