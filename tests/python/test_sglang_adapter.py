"""KvstrataHiCacheStorage (kvstrata.sglang) driven the way SGLang's HiCache controller drives a
storage backend: a prefetch asks batch_exists over the page keys in batches, the TP ranks agree on
the MIN of their hit counts, and batch_get_v1 reads that many pages into host-pool slots (the
leading run of successes counts); a backup is batch_set_v1 from host-pool slots. The host pool is
this file's own, shaped like SGLang's MHA and MLA host pools in the layer_first and page_first
layouts, with a get_page_buffer_meta that lists each page's segments the way theirs does. Needs
libkvstrata with the store API (KVSTRATA_LIBRARY) and kvstrata.store."""

import hashlib
import importlib
import inspect
import json
import os
import subprocess
import sys
import tempfile
import threading
import unittest
import uuid

import torch

from kvstrata import _sglang_standin as standin
from kvstrata import sglang as ks

HERE = os.path.dirname(os.path.abspath(__file__))
PAGE = 4  # tokens per page
LAYERS = 3
HEADS = 2
DIM = 8
POOL_PAGES = 16
BATCH = 128  # SGLang's STORAGE_BATCH_SIZE
MAX_VALUE = 1 << 20  # every store on the shared tier opens with this largest value


class HostPool:
    """A host KV pool like SGLang's: kv_buffer holds K then V (MHA) or the latent KV (MLA), token
    slots indexed by host indices, page p in slots [p * PAGE, (p + 1) * PAGE)."""

    def __init__(self, layout, mla=False, pages=POOL_PAGES, dtype=torch.bfloat16):
        self.layout = layout
        self.mla = mla
        self.page_size = PAGE
        self.layer_num = LAYERS
        self.head_num = 1 if mla else HEADS
        self.head_dim = DIM
        self.dtype = dtype
        self.size = pages * PAGE
        self.itemsize = torch.tensor([], dtype=dtype).element_size()
        self.size_per_token = (1 if mla else 2) * LAYERS * self.head_num * DIM * self.itemsize
        tok = (self.head_num, DIM)
        if layout == "layer_first":
            dims = (LAYERS, self.size) + tok
        elif layout == "page_first":
            dims = (self.size, LAYERS) + tok
        else:
            raise ValueError(layout)
        self.kv_buffer = torch.zeros(dims if mla else (2,) + dims, dtype=dtype)

    def get_page_buffer_meta(self, indices):
        """Per page (in order): layer_first, each layer's K run then V run (MLA: its one run);
        page_first, the page's K run then V run (MLA: one run)."""
        assert len(indices) % self.page_size == 0
        idx = indices.tolist()
        base = self.kv_buffer.data_ptr()
        tok = self.head_num * self.head_dim * self.itemsize
        half = LAYERS * self.size * tok  # bytes of the K (or V) half
        ptrs, sizes = [], []
        for at in range(0, len(idx), self.page_size):
            first = idx[at]
            if self.layout == "layer_first":
                for layer in range(LAYERS):
                    k = base + (layer * self.size + first) * tok
                    runs = [k] if self.mla else [k, k + half]
                    ptrs += runs
                    sizes += [self.page_size * tok] * len(runs)
            else:
                k = base + first * LAYERS * tok
                runs = [k] if self.mla else [k, k + half]
                ptrs += runs
                sizes += [self.page_size * LAYERS * tok] * len(runs)
        return ptrs, sizes

    def view(self, page):
        s = slice(page * PAGE, (page + 1) * PAGE)
        if self.layout == "layer_first":
            return self.kv_buffer[:, s] if self.mla else self.kv_buffer[:, :, s]
        return self.kv_buffer[s] if self.mla else self.kv_buffer[:, s]

    def fill(self, page, seed):
        g = torch.Generator().manual_seed(seed)
        v = self.view(page)
        v.copy_(torch.randn(v.shape, generator=g).to(self.dtype))

    def page_bytes(self, page):
        return bytes(self.view(page).contiguous().view(torch.uint8).numpy())

    def digest(self, page):
        return hashlib.sha256(self.page_bytes(page)).hexdigest()


def page_keys(tag, n):
    """SGLang-like page keys: a chain of sha256 hex digests."""
    keys, prev = [], b""
    for i in range(n):
        prev = hashlib.sha256(prev + f"{tag}:{i}".encode()).hexdigest().encode()
        keys.append(prev.decode())
    return keys


def host_indices(pages):
    return torch.cat([torch.arange(p * PAGE, (p + 1) * PAGE, dtype=torch.int64) for p in pages])


def make_config(tp_rank=0, tp_size=1, mla=False, page_first=False, extra=None):
    return ks.HiCacheStorageConfig(
        tp_rank=tp_rank, tp_size=tp_size, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
        is_mla_model=mla, enable_storage_metrics=False, is_page_first_layout=page_first,
        model_name="test/tiny-model", extra_config=dict(extra or {}))


def make_backend(pool, config_path, tenant=None, tp_rank=0, tp_size=1, interface_v1=True,
                 pin_ms=0):
    extra = {"backend_name": "kvstrata", "module_path": "kvstrata.sglang",
             "class_name": "KvstrataHiCacheStorage", "interface_v1": 1 if interface_v1 else 0,
             "config": config_path, "max_value_bytes": MAX_VALUE}
    if pin_ms:
        extra["pin_ms"] = pin_ms
    if tenant:
        extra["tenant"] = tenant
    cfg = make_config(tp_rank, tp_size, pool.mla if pool else False,
                      bool(pool and pool.layout == "page_first"), extra)
    backend = ks.KvstrataHiCacheStorage(cfg, {})  # what SGLang's dynamic loader passes
    if pool is not None:
        backend.register_mem_pool_host(pool)
    return backend


# ---- the controller's calls, in its order ----

def backup(backend, keys, pages):
    """The backup thread: batch_set_v1 batch by batch; stops at the first failed batch."""
    done = 0
    for at in range(0, len(keys), BATCH):
        ks_ = keys[at:at + BATCH]
        if not all(backend.batch_set_v1(ks_, host_indices(pages[at:at + len(ks_)]))):
            break
        done += len(ks_)
    return done


def hit_query(backend, keys):
    """The prefetch thread's storage hit query: batch_exists batch by batch up to the first miss."""
    hits = 0
    for at in range(0, len(keys), BATCH):
        ks_ = keys[at:at + BATCH]
        n = backend.batch_exists(ks_)
        hits += n
        if n < len(ks_):
            break
    return hits


def load(backend, keys, pages):
    """The prefetch I/O thread: batch_get_v1 per batch, counting the leading run of successes."""
    done = 0
    for at in range(0, len(keys), BATCH):
        ks_ = keys[at:at + BATCH]
        results = backend.batch_get_v1(ks_, host_indices(pages[at:at + len(ks_)]))
        run = results.index(False) if False in results else len(results)
        done += run
        if run < len(ks_):
            break
    return done


def prefetch(backends, keys, pages):
    """Every TP rank's hit query, SGLang's MIN all-reduce over them, then each rank's load of the
    agreed pages and the MIN of what they completed."""
    hits = [hit_query(b, keys) for b in backends]
    agreed = min(hits)
    loaded = [load(b, keys[:agreed], pages[:agreed]) for b in backends]
    return hits, agreed, min(loaded) if loaded else 0


def dram_config(directory, shm_name):
    path = os.path.join(directory, "sglang.yaml")
    with open(path, "w") as f:
        f.write("version: 1\nchunk_tokens: 256\ntiers:\n  - name: dram\n    type: dram\n"
                "    capacity: 64MiB\n    options:\n      shm_name: %s\n" % shm_name)
    return path


def corrupt_shm(shm_name, needle):
    """Flip one byte of the first place `needle` lies in the DRAM tier's shared memory object."""
    with open(os.path.join("/dev/shm", shm_name), "r+b") as f:
        data = f.read()
        at = data.find(needle)
        if at < 0:
            return None
        f.seek(at + len(needle) // 2)
        f.write(bytes([data[at + len(needle) // 2] ^ 0xFF]))
    return at


class SharedTier(unittest.TestCase):
    """Each test gets its own shared DRAM tier; this process holds it open throughout, so pages a
    child process stored outlive that process."""

    def setUp(self):
        from kvstrata.store import Store

        self.dir = tempfile.mkdtemp(prefix="kvs-sgl-")
        self.shm = "kvs-sgl-%d-%s" % (os.getpid(), uuid.uuid4().hex[:8])
        self.config = dram_config(self.dir, self.shm)
        self.holder = Store("holder", config=self.config, max_value_bytes=MAX_VALUE)
        self.backends = []

    def tearDown(self):
        for b in self.backends:
            b.close()
        self.holder.close()
        self.assertFalse(os.path.exists(os.path.join("/dev/shm", self.shm)),
                         "the last store to close removes the shared tier")

    def backend(self, pool, **kw):
        b = make_backend(pool, self.config, **kw)
        self.backends.append(b)
        return b


class CrossProcess(SharedTier):
    def child(self, *args):
        out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", *args],
                             capture_output=True, text=True, timeout=120, env=os.environ.copy())
        self.assertEqual(out.returncode, 0, out.stderr)
        return json.loads(out.stdout.strip().splitlines()[-1])

    def round_trip(self, layout, mla=False):
        n = 5
        spec = json.dumps({"config": self.config, "layout": layout, "mla": mla, "n": n,
                           "tag": layout, "write_pages": [0, 1, 2, 3, 4],
                           "read_pages": [9, 3, 12, 0, 7]})
        wrote = self.child("write", spec)
        self.assertEqual(wrote["stored"], n)
        got = self.child("read", spec)
        self.assertEqual(got["hits"], n, "the reader finds every page the writer stored")
        self.assertEqual(got["results"], [True] * n)
        want = HostPool(layout, mla)
        for i, p in enumerate([0, 1, 2, 3, 4]):
            want.fill(p, 1000 + i)
        self.assertEqual(got["digests"], [want.digest(p) for p in [0, 1, 2, 3, 4]],
                         "each page arrives byte for byte in the reader's host slots")
        self.assertEqual(got["untouched_zero"], True, "no other host slot is written")

    def test_mha_layer_first_pages_saved_by_one_process_are_read_by_another(self):
        self.round_trip("layer_first")

    def test_mha_page_first_pages_saved_by_one_process_are_read_by_another(self):
        self.round_trip("page_first")

    def test_mla_page_first_pages_saved_by_one_process_are_read_by_another(self):
        self.round_trip("page_first", mla=True)


class Semantics(SharedTier):
    def stored(self, pool, backend, keys, pages, seed=1000):
        for i, p in enumerate(pages):
            pool.fill(p, seed + i)
        self.assertEqual(backup(backend, keys, pages), len(keys))

    def test_exists_is_the_leading_run_and_a_miss_fails_alone(self):
        pool = HostPool("layer_first")
        b = self.backend(pool)
        keys = page_keys("run", 6)
        self.stored(pool, b, [keys[i] for i in (0, 1, 2, 4)], [0, 1, 2, 4])
        self.assertEqual(b.batch_exists(keys), 3, "page 3 is missing: the run ends there")
        self.assertEqual(b.batch_exists(keys[4:5]), 1)
        self.assertEqual(b.batch_exists(page_keys("other", 3)), 0)
        self.assertTrue(b.exists(keys[4]))
        self.assertFalse(b.exists(keys[5]))
        reader = HostPool("layer_first")
        rb = self.backend(reader)  # another scheduler's pool, the same namespace
        results = rb.batch_get_v1(keys, host_indices(range(6, 12)))
        self.assertEqual(results, [True, True, True, False, True, False])
        for i, p in enumerate(range(6, 11)):
            if results[i]:
                self.assertEqual(reader.page_bytes(p), pool.page_bytes([0, 1, 2, 3, 4][i]))
        self.assertEqual(load(rb, keys, list(range(6, 12))), 3, "the controller counts 3 pages")

    def test_a_corrupt_page_fails_alone_is_never_counted_and_is_removed(self):
        pool = HostPool("page_first")
        b = self.backend(pool)
        keys = page_keys("bad", 3)
        self.stored(pool, b, keys, [0, 1, 2])
        needle = pool.page_bytes(1)[:64]  # page 1's K run begins with these bytes
        self.assertIsNotNone(corrupt_shm(self.shm, needle), "page 1 lies in the shared tier")
        reader = HostPool("page_first")
        rb = self.backend(reader)
        results = rb.batch_get_v1(keys, host_indices([4, 5, 6]))
        self.assertEqual(results, [True, False, True])
        self.assertEqual(reader.page_bytes(4), pool.page_bytes(0))
        self.assertEqual(reader.page_bytes(6), pool.page_bytes(2))
        self.assertEqual(rb.corrupt_pages, 1)
        self.assertEqual(b.batch_exists(keys), 1, "the corrupt page was removed")
        self.assertFalse(b.exists(keys[1]))
        self.assertGreaterEqual(rb.store_stats()["corrupt"], 1)
        # the controller's replay: the corrupt page ends the run, so neither it nor the page after
        # it is handed to the radix tree (SGLang frees their host slots)
        self.assertEqual(load(rb, keys, [4, 5, 6]), 1)

    def test_threads_back_up_and_load_at_once(self):
        pool = HostPool("layer_first", pages=32)
        b = self.backend(pool)
        errors = []

        def worker(t):
            try:
                keys = page_keys(f"thread{t}", 4)
                pages = [t * 4 + i for i in range(4)]
                for i, p in enumerate(pages):
                    pool.fill(p, 500 + t * 10 + i)
                want = [pool.page_bytes(p) for p in pages]
                for _ in range(5):
                    if backup(b, keys, pages) != 4 or hit_query(b, keys) != 4:
                        errors.append((t, "store"))
                        return
                    dst = [16 + p for p in pages]
                    if load(b, keys, dst) != 4:
                        errors.append((t, "load"))
                        return
                    if [pool.page_bytes(p) for p in dst] != want:
                        errors.append((t, "bytes"))
                        return
            except Exception as e:  # reported below
                errors.append((t, repr(e)))

        threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        self.assertEqual(errors, [])

    def test_two_tenants_never_see_each_other(self):
        pool = HostPool("page_first")
        a = self.backend(pool, tenant="tenant-a")
        keys = page_keys("tenant", 3)
        self.stored(pool, a, keys, [0, 1, 2])
        b = self.backend(HostPool("page_first"), tenant="tenant-b")
        self.assertEqual(b.batch_exists(keys), 0)
        self.assertEqual(b.batch_get_v1(keys, host_indices([0, 1, 2])), [False] * 3)
        none = self.backend(HostPool("page_first"))
        self.assertEqual(none.batch_exists(keys), 0, "nor does a backend without a tenant")
        again = HostPool("page_first")
        a2 = self.backend(again, tenant="tenant-a")
        self.assertEqual(a2.batch_exists(keys), 3, "another backend of tenant a finds them")
        self.assertEqual(a2.batch_get_v1(keys, host_indices([3, 4, 5])), [True] * 3)
        self.assertEqual(again.page_bytes(4), pool.page_bytes(1))

    def test_two_layouts_never_share_a_page(self):
        lf = HostPool("layer_first")
        a = self.backend(lf)
        keys = page_keys("layout", 2)
        self.stored(lf, a, keys, [0, 1])
        pf = self.backend(HostPool("page_first"))
        self.assertEqual(pf.batch_exists(keys), 0)
        self.assertNotEqual(a.namespace, pf.namespace)

    def test_mla_rank_0_writes_and_rank_1_reads_its_pages(self):
        p0, p1 = HostPool("page_first", mla=True), HostPool("page_first", mla=True)
        r0 = self.backend(p0, tp_rank=0, tp_size=2)
        r1 = self.backend(p1, tp_rank=1, tp_size=2)
        self.assertEqual(r0.namespace, r1.namespace, "MLA keys are rank-agnostic")
        keys = page_keys("mla", 3)
        for i in range(3):
            p1.fill(i, 9000 + i)
        self.assertEqual(r1.batch_set_v1(keys, host_indices([0, 1, 2])), [True] * 3,
                         "rank 1's backup answers success")
        self.assertEqual(r0.batch_exists(keys), 0, "and writes nothing")
        self.assertTrue(r1.set(keys[0], torch.ones(8)), "the generic set too")
        self.assertEqual(r0.batch_exists(keys), 0)
        for i in range(3):
            p0.fill(i, 100 + i)
        self.assertEqual(backup(r0, keys, [0, 1, 2]), 3)
        hits, agreed, done = prefetch([r0, r1], keys, [5, 6, 7])
        self.assertEqual((hits, agreed, done), ([3, 3], 3, 3))
        for i in range(3):
            self.assertEqual(p1.page_bytes(5 + i), p0.page_bytes(i),
                             "rank 1 loads rank 0's pages")

    def test_tp_ranks_load_the_min_of_their_hits(self):
        p0, p1 = HostPool("layer_first"), HostPool("layer_first")
        r0 = self.backend(p0, tp_rank=0, tp_size=2)
        r1 = self.backend(p1, tp_rank=1, tp_size=2)
        self.assertNotEqual(r0.namespace, r1.namespace, "each rank stores its own shard")
        keys = page_keys("tp", 4)
        self.stored(p0, r0, keys, [0, 1, 2, 3], seed=10)
        self.assertEqual(r1.batch_exists(keys), 0, "rank 0's pages are not rank 1's")
        self.stored(p1, r1, keys[:2], [0, 1], seed=20)  # rank 1 backed up two pages only
        for p in (8, 9, 10, 11):
            p0.fill(p, 3000 + p)
        fresh = {p: p0.page_bytes(p) for p in (10, 11)}
        hits, agreed, done = prefetch([r0, r1], keys, [8, 9, 10, 11])
        self.assertEqual(hits, [4, 2], "each rank reports its own count")
        self.assertEqual((agreed, done), (2, 2), "the MIN over the ranks is what is loaded")
        self.assertEqual(p0.page_bytes(8), p0.page_bytes(0))
        self.assertEqual(p0.page_bytes(9), p0.page_bytes(1))
        self.assertEqual(p1.page_bytes(8), p1.page_bytes(0))
        self.assertEqual(p1.page_bytes(9), p1.page_bytes(1))
        for p in (10, 11):
            self.assertEqual(p0.page_bytes(p), fresh[p], "rank 0 loads no page past the MIN")

    def test_the_generic_path_copies_flat_pages(self):
        b = self.backend(HostPool("page_first"), interface_v1=False)
        keys = page_keys("flat", 3)
        pages = [torch.randn(64, generator=torch.Generator().manual_seed(i)) for i in range(3)]
        self.assertTrue(b.batch_set(keys[:2], pages[:2]))
        self.assertTrue(b.set(keys[2], pages[2][::2]), "a strided page is copied first")
        self.assertEqual(b.batch_exists(keys), 3)
        dst = [torch.zeros(64) for _ in range(2)] + [torch.zeros(32)]
        got = b.batch_get(keys, dst)
        self.assertIs(got[0], dst[0])
        self.assertTrue(torch.equal(dst[1], pages[1]))
        self.assertTrue(torch.equal(dst[2], pages[2][::2]))
        self.assertIsNone(b.get(page_keys("flat-miss", 1)[0], torch.zeros(64)))
        self.assertIsNone(b.get(keys[0], torch.zeros(32)), "a page longer than its target fails")
        self.assertIsNone(b.get(keys[2], torch.zeros(64)), "so does one shorter than its target")
        v1 = self.backend(HostPool("page_first"))
        self.assertEqual(v1.batch_exists(keys), 0, "flat pages and v1 pages never meet")

    def test_clear_removes_what_this_backend_stored(self):
        pool = HostPool("page_first")
        b = self.backend(pool)
        keys = page_keys("clear", 3)
        self.stored(pool, b, keys, [0, 1, 2])
        self.assertTrue(b.clear())
        self.assertEqual(b.batch_exists(keys), 0)

    def test_the_keys_kept_for_clear_are_bounded(self):
        # a server stores pages for months: only the most recent keys are kept for clear
        pool = HostPool("page_first")
        b = self.backend(pool)
        b._stored.limit = 2
        keys = page_keys("bounded", 3)
        self.stored(pool, b, keys, [0, 1, 2])
        self.assertEqual(len(b._stored), 2)
        self.assertTrue(b.clear())
        self.assertEqual(b.batch_exists(keys), 1, "the oldest page was forgotten, not removed")
        self.assertEqual(b.batch_exists(keys[1:]), 0)


def broken(*args, **kwargs):
    """A store call that fails the way a broken tier or a closed store does."""
    from kvstrata._abi_types import EIO
    from kvstrata.store import StoreError

    raise StoreError("exists", EIO, "the tier is gone")


class StoreFailures(SharedTier):
    """SGLang calls the backend from its prefetch and backup threads, which catch nothing: a store
    failure must come back as a miss, never as an exception that ends the thread."""

    def test_a_failing_store_is_a_miss_in_every_call_sglang_makes(self):
        pool = HostPool("layer_first")
        b = self.backend(pool, pin_ms=5000)
        keys = page_keys("broken", 3)
        for i, p in enumerate([0, 1, 2]):
            pool.fill(p, 50 + i)
        self.assertEqual(b.batch_set_v1(keys, host_indices([0, 1, 2])), [True] * 3)
        store = b.store
        for name in ("exists", "unpin", "submit_get", "submit_put", "remove"):
            setattr(store, name, broken)
        with self.assertLogs("kvstrata", "WARNING") as logs:
            self.assertEqual(b.batch_exists(keys), 0)
            self.assertEqual(b.batch_exists(keys), 0)
            self.assertFalse(b.exists(keys[0]))
            self.assertEqual(b.batch_get_v1(keys, host_indices([4, 5, 6])), [False] * 3)
            self.assertEqual(b.batch_set_v1(page_keys("more", 2), host_indices([7, 8])),
                             [False] * 2)
            self.assertFalse(b.clear())
        said = [r.getMessage() for r in logs.records]
        self.assertEqual(sum("batch_exists" in m for m in said), 1, "logged once, not per call")
        self.assertTrue(any("batch_get_v1" in m and "tier is gone" in m for m in said), said)
        self.assertGreaterEqual(b.store_failures, 7)

    def test_an_unpin_that_fails_keeps_the_pages_that_arrived(self):
        pool = HostPool("page_first")
        b = self.backend(pool, pin_ms=5000)
        keys = page_keys("unpin", 2)
        for i, p in enumerate([0, 1]):
            pool.fill(p, 70 + i)
        self.assertEqual(b.batch_set_v1(keys, host_indices([0, 1])), [True, True])
        self.assertEqual(b.batch_exists(keys), 2)
        b.store.unpin = broken
        with self.assertLogs("kvstrata", "WARNING"):
            self.assertEqual(b.batch_get_v1(keys, host_indices([2, 3])), [True, True])
        self.assertEqual(pool.page_bytes(2), pool.page_bytes(0))
        self.assertEqual(pool.page_bytes(3), pool.page_bytes(1))

    def test_a_store_that_cannot_open_is_a_miss(self):
        cfg = make_config(extra={"config": os.path.join(self.dir, "missing.yaml")})
        b = ks.KvstrataHiCacheStorage(cfg, {})  # opened lazily: no host pool yet
        self.backends.append(b)
        keys = page_keys("noopen", 2)
        with self.assertLogs("kvstrata", "WARNING") as logs:
            self.assertEqual(b.batch_exists(keys), 0)
            self.assertFalse(b.exists(keys[0]))
            self.assertEqual(b.batch_get(keys, [torch.zeros(8), torch.zeros(8)]), [None, None])
            self.assertFalse(b.batch_set(keys, [torch.zeros(8), torch.zeros(8)]))
        self.assertTrue(any("missing.yaml" in r.getMessage() for r in logs.records),
                        [r.getMessage() for r in logs.records])
        self.assertIsNone(b._store)


class Interface(unittest.TestCase):
    def test_every_abstract_method_is_implemented_with_a_compatible_signature(self):
        base = standin.HiCacheStorage
        cls = ks.KvstrataHiCacheStorage
        self.assertEqual(getattr(cls, "__abstractmethods__", frozenset()), frozenset())
        self.assertTrue({"get", "batch_get", "set", "batch_set", "exists"}
                        <= base.__abstractmethods__)
        checked = set(base.__abstractmethods__) | {
            "batch_exists", "batch_get_v1", "batch_set_v1", "register_mem_pool_host", "clear"}
        for name in sorted(checked):
            mine = inspect.signature(getattr(cls, name))
            theirs = inspect.signature(getattr(base, name))
            self.assertIsNot(getattr(cls, name), getattr(base, name), name)
            self.assertEqual(list(mine.parameters), list(theirs.parameters), name)
            for p in theirs.parameters.values():
                if p.default is not inspect.Parameter.empty:
                    self.assertIsNot(mine.parameters[p.name].default, inspect.Parameter.empty,
                                     f"{name}({p.name}) keeps its default")

    def test_the_dynamic_loader_can_build_it(self):
        module = importlib.import_module("kvstrata.sglang")
        cls = getattr(module, "KvstrataHiCacheStorage")
        self.assertTrue(issubclass(cls, ks.HiCacheStorage))
        params = list(inspect.signature(cls.__init__).parameters)
        self.assertEqual(params[:3], ["self", "storage_config", "kwargs"],
                         "SGLang calls backend_class(storage_config, kwargs)")

    def test_namespaces_hold_what_changes_a_page(self):
        pool = HostPool("page_first")
        base = ks.namespace_for(make_config(0, 2), pool)
        self.assertNotEqual(base, ks.namespace_for(make_config(1, 2), pool))
        self.assertNotEqual(base, ks.namespace_for(make_config(0, 2), HostPool("layer_first")))
        self.assertNotEqual(base, ks.namespace_for(make_config(0, 2), pool, interface_v1=False))
        self.assertNotEqual(base, ks.namespace_for(make_config(0, 2),
                                                   HostPool("page_first", dtype=torch.float16)))
        mla = HostPool("page_first", mla=True)
        self.assertEqual(ks.namespace_for(make_config(0, 2, mla=True), mla),
                         ks.namespace_for(make_config(1, 2, mla=True), mla))


def _child(mode, spec):
    spec = json.loads(spec)
    pool = HostPool(spec["layout"], spec["mla"])
    backend = make_backend(pool, spec["config"])
    keys = page_keys(spec["tag"], spec["n"])
    try:
        if mode == "write":
            pages = spec["write_pages"]
            for i, p in enumerate(pages):
                pool.fill(p, 1000 + i)
            print(json.dumps({"stored": backup(backend, keys, pages)}))
        else:
            pages = spec["read_pages"]
            hits = hit_query(backend, keys + page_keys("absent", 1))
            results = backend.batch_get_v1(keys, host_indices(pages))
            zero = bytes(len(pool.page_bytes(0)))
            untouched = all(pool.page_bytes(p) == zero
                            for p in range(POOL_PAGES) if p not in pages)
            print(json.dumps({"hits": hits, "results": results,
                              "digests": [pool.digest(p) for p in pages],
                              "untouched_zero": untouched}))
    finally:
        backend.close()


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        sys.path.insert(0, HERE)
        _child(sys.argv[2], sys.argv[3])
    else:
        unittest.main()
