"""kvstrata.lmcache driven the way LMCache drives its storage.

The native plugin is driven as LMCache's multi-process server drives one (its L2 adapter over a
native connector): submits under one lock that records each future id, one thread that polls the
plugin's event fd and calls drain_completions, results routed by future id. Chunks are LMCache
memory objects' byte arrays (memoryviews over ctypes arrays). The RemoteConnector is driven from an
asyncio loop in its own thread, as LMCache's remote backend runs it, with an allocator that hands
out tensor-backed memory objects.

Processes: one process saves chunks, another reads them back byte for byte, through a DRAM tier
in shared memory and through an SSD tier; a byte flipped in the SSD tier's file makes that key's
get fail (LMCache is told the key did not load) and removes the object.
"""

import asyncio
import ctypes
import glob
import inspect
import os
import select
import subprocess
import tempfile
import threading
import unittest
import uuid

import torch

from kvstrata import _lmcache_standin as standin
from kvstrata import lmcache

PYTHON = "/usr/bin/python3"
HERE = os.path.dirname(os.path.abspath(__file__))
# the children import the same kvstrata package as this process
PYDIR = os.path.dirname(os.path.dirname(os.path.abspath(lmcache.__file__)))

CHUNK = 8192


def chunk_bytes(seed, n=CHUNK):
    """A chunk's deterministic contents; every chunk differs from every other."""
    g = torch.Generator().manual_seed(seed)
    return bytes(torch.randint(0, 256, (n,), generator=g, dtype=torch.uint8).numpy())


def byte_array(n, fill=0):
    """What LMCache hands a native connector: a memoryview over a ctypes byte array."""
    arr = (ctypes.c_ubyte * n)()
    if fill:
        ctypes.memset(arr, fill, n)
    return memoryview(arr).cast("B")


def object_key(model, rank, group, chunk_hash):
    """LMCache's object-key string: model@rank(8 hex)@group(hex)@chunk hash(hex)."""
    return "%s@%08x@%x@%s" % (model, rank, group, chunk_hash.hex())


def keys_for(prefix, n):
    return [object_key("llama-3-8b", 0, 0, ("%s-%d" % (prefix, i)).encode().ljust(16, b".")[:16])
            for i in range(n)]


class Driver:
    """The multi-process server's side of a native connector: LMCache's call order."""

    def __init__(self, client):
        self.client = client
        self.lock = threading.Lock()
        self.pending = {}  # future id -> threading.Event, set when its completion arrives
        self.done = {}     # future id -> (ok, error, per_key)
        self.unknown = []  # completions for future ids never submitted (must stay empty)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._demux, daemon=True)
        self.thread.start()

    def _submit(self, fn, *args):
        with self.lock:
            fid = int(fn(*args))
            self.pending[fid] = threading.Event()
            return fid

    def set(self, keys, views):
        return self._submit(self.client.submit_batch_set, keys, views)

    def get(self, keys, views):
        return self._submit(self.client.submit_batch_get, keys, views)

    def exists(self, keys):
        return self._submit(self.client.submit_batch_exists, keys)

    def delete(self, keys):
        return self._submit(self.client.submit_batch_delete, keys)

    def result(self, fid, timeout=30):
        if not self.pending[fid].wait(timeout):
            raise AssertionError("no completion for future %d" % fid)
        with self.lock:
            del self.pending[fid]
            return self.done.pop(fid)

    def run(self, fn, *args):
        return self.result(getattr(self, fn)(*args))

    def _demux(self):
        poller = select.poll()
        poller.register(self.client.event_fd(), select.POLLIN)
        while not self.stop.is_set():
            if not poller.poll(100):
                continue
            completions = self.client.drain_completions()
            with self.lock:
                for fid, ok, error, per_key in completions:
                    ev = self.pending.get(int(fid))
                    if ev is None:
                        self.unknown.append(fid)
                        continue
                    self.done[int(fid)] = (ok, error, per_key)
                    ev.set()

    def close(self):
        self.stop.set()
        self.thread.join(5)
        self.client.close()


def dram_config(dirname, shm_name=None, capacity="64MiB"):
    path = os.path.join(dirname, "dram.yaml")
    opts = "    options:\n      shm_name: %s\n" % shm_name if shm_name else ""
    with open(path, "w") as f:
        f.write("version: 1\ntiers:\n  - name: dram\n    type: dram\n    capacity: %s\n%s"
                % (capacity, opts))
    return path


def ssd_config(dirname):
    data = os.path.join(dirname, "ssd")
    os.makedirs(data, exist_ok=True)
    path = os.path.join(dirname, "ssd.yaml")
    with open(path, "w") as f:
        f.write("version: 1\ntiers:\n  - name: nvme\n    type: ssd\n    capacity: 64MiB\n"
                "    paths: [%s]\n    options:\n      stripe_bytes: 64KiB\n"
                "      write_buffer_bytes: 4MiB\n      io_engine: pread\n" % data)
    return path, data


CHILD = r"""
import hashlib, json, select, sys
sys.path.insert(0, %(testdir)r)
from test_lmcache_adapter import Driver, byte_array, chunk_bytes, keys_for, CHUNK
from kvstrata.lmcache import KvstrataNativeConnector
a = json.loads(sys.argv[1])
d = Driver(KvstrataNativeConnector(config=a["config"], namespace=a["namespace"],
                                   tenant=a.get("tenant"), max_value_bytes=1 << 20))
keys = keys_for(a["prefix"], a["n"])
out = {}
if a["op"] == "save":
    views = []
    for i in range(a["n"]):
        v = byte_array(CHUNK)
        v[:] = chunk_bytes(a["seed"] + i)
        views.append(v)
    out["set"] = d.run("set", keys, views)
else:
    views = [byte_array(CHUNK, 0x5A) for _ in keys]
    out["get"] = d.run("get", keys, views)
    out["digests"] = [hashlib.sha256(bytes(v)).hexdigest() for v in views]
    out["exists"] = d.run("exists", keys)
out["unknown"] = d.unknown
d.close()
print(json.dumps(out))
"""


def child(op, config, namespace, prefix, n, seed=0, tenant=None):
    import json

    env = dict(os.environ)
    env["PYTHONPATH"] = PYDIR + os.pathsep + env.get("PYTHONPATH", "")
    arg = json.dumps(dict(op=op, config=config, namespace=namespace, prefix=prefix, n=n, seed=seed,
                          tenant=tenant))
    p = subprocess.run([PYTHON, "-c", CHILD % {"testdir": HERE}, arg], env=env,
                       capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        raise AssertionError("child %s failed (%d):\n%s" % (op, p.returncode, p.stderr[-4000:]))
    return json.loads(p.stdout.strip().splitlines()[-1])


def sha(b):
    import hashlib

    return hashlib.sha256(b).hexdigest()


class Signatures(unittest.TestCase):
    """The adapters offer each method LMCache calls, with its parameters and its async-ness."""

    def check(self, ours, theirs, names):
        for name in names:
            mine, base = getattr(ours, name), getattr(theirs, name)
            self.assertEqual(list(inspect.signature(mine).parameters),
                             list(inspect.signature(base).parameters), name)
            self.assertEqual(inspect.iscoroutinefunction(mine),
                             inspect.iscoroutinefunction(base), name)

    def test_native_plugin(self):
        names = ["event_fd", "submit_batch_get", "submit_batch_set", "submit_batch_exists",
                 "submit_batch_delete", "drain_completions", "close"]
        self.check(lmcache.KvstrataNativeConnector, standin.NativeConnectorClient, names)

    def test_remote_connector(self):
        names = [n for n, v in vars(standin.RemoteConnector).items()
                 if callable(v) and not n.startswith("_")]
        self.assertIn("batched_get_non_blocking", names)
        self.check(lmcache.KvstrataRemoteConnector, standin.RemoteConnector, names)
        # every abstract method of the base is implemented
        self.assertEqual(getattr(lmcache.KvstrataRemoteConnector, "__abstractmethods__", set()),
                         frozenset())

    def test_connector_adapter(self):
        self.check(lmcache.KvstrataConnectorAdapter, standin.ConnectorAdapter,
                   ["create_connector", "can_parse"])
        self.assertTrue(lmcache.KvstrataConnectorAdapter().can_parse("kvstrata://x:0/?tenant=a"))
        self.assertFalse(lmcache.KvstrataConnectorAdapter().can_parse("redis://x:1"))


class NativePlugin(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="kvs-lmc-")
        self.addCleanup(self.tmp.cleanup)
        self.drivers = []

    def tearDown(self):
        for d in self.drivers:
            d.close()

    def open(self, config=None, namespace="ns-bf16-256", tenant=None, **kw):
        d = Driver(lmcache.KvstrataNativeConnector(config=config, namespace=namespace,
                                                   tenant=tenant, max_value_bytes=1 << 20, **kw))
        self.drivers.append(d)
        return d

    def test_save_in_one_process_read_in_another_shared_dram(self):
        shm = "kvs-lmc-" + uuid.uuid4().hex[:12]
        cfg = dram_config(self.tmp.name, shm_name=shm)
        # this process holds the shared tier open while the children come and go
        holder = self.open(cfg)
        saved = child("save", cfg, "ns-bf16-256", "p", 6, seed=100)
        ok, error, per_key = saved["set"]
        self.assertTrue(ok, error)
        self.assertEqual(per_key, [True] * 6)
        self.assertEqual(saved["unknown"], [])
        back = child("load", cfg, "ns-bf16-256", "p", 6)
        self.assertEqual(back["get"][2], [True] * 6)
        self.assertEqual(back["digests"], [sha(chunk_bytes(100 + i)) for i in range(6)])
        self.assertEqual(back["exists"][2], [True] * 6)
        # and this process reads them too, and a namespace of another layout does not
        views = [byte_array(CHUNK) for _ in range(6)]
        self.assertEqual(holder.run("get", keys_for("p", 6), views)[2], [True] * 6)
        self.assertEqual(bytes(views[5]), chunk_bytes(105))
        other = child("load", cfg, "ns-fp8-256", "p", 6)
        self.assertEqual(other["get"][2], [False] * 6)

    def test_exists_and_misses(self):
        d = self.open()
        keys = keys_for("e", 4)
        views = [byte_array(CHUNK) for _ in range(2)]
        for i, v in enumerate(views):
            v[:] = chunk_bytes(i)
        self.assertEqual(d.run("set", keys[:2], views), (True, "", [True, True]))
        ok, _, per_key = d.run("exists", [keys[3], keys[0], keys[2], keys[1]])
        self.assertTrue(ok)
        self.assertEqual(per_key, [False, True, False, True])
        out = [byte_array(CHUNK, 0x11) for _ in keys]
        ok, _, per_key = d.run("get", keys, out)
        self.assertEqual(per_key, [True, True, False, False])
        self.assertEqual(bytes(out[1]), chunk_bytes(1))
        # a buffer of another length than the stored value is not a load
        ok, _, per_key = d.run("get", keys[:1], [byte_array(CHUNK // 2)])
        self.assertEqual(per_key, [False])
        # a second set of a stored key is a success (nothing rewritten)
        self.assertEqual(d.run("set", keys[:1], [byte_array(CHUNK)])[2], [True])
        back = byte_array(CHUNK)
        d.run("get", keys[:1], [back])
        self.assertEqual(bytes(back), chunk_bytes(0))
        self.assertEqual(d.unknown, [])

    def test_a_value_over_the_limit_fails_alone(self):
        d = self.open()
        keys = keys_for("big", 2)
        with self.assertLogs("kvstrata.lmcache", "WARNING") as logs:
            ok, error, per_key = d.run("set", keys, [byte_array(CHUNK, 1), byte_array(2 << 20, 2)])
        self.assertFalse(ok)
        self.assertEqual(per_key, [True, False])
        self.assertIn("key 1", error)
        self.assertIn("larger than max_value_bytes (1048576)", error)
        self.assertTrue(any("2097152 bytes is larger than max_value_bytes" in r.getMessage()
                            for r in logs.records), [r.getMessage() for r in logs.records])
        self.assertEqual(d.run("exists", keys)[2], [True, False])

    def test_the_default_limit_takes_a_256_token_chunk_of_llama_3_8b(self):
        # 32 layers x K and V x 8 KV heads x 128 x bf16 = 128 KiB a token, 32 MiB a chunk; a
        # header or a padded chunk a little over it still fits
        d = Driver(lmcache.KvstrataNativeConnector(namespace="bf16-chunk256"))
        self.drivers.append(d)
        self.assertEqual(d.client.max_value_bytes, lmcache.DEFAULT_MAX_VALUE_BYTES)
        key = keys_for("llama", 1)
        n = 33 << 20
        view = byte_array(n)
        view[:1 << 20] = chunk_bytes(5, 1 << 20)
        view[n - 4096:] = chunk_bytes(6, 4096)
        self.assertEqual(d.run("set", key, [view]), (True, "", [True]))
        back = byte_array(n, 0x33)
        self.assertEqual(d.run("get", key, [back])[2], [True])
        self.assertEqual(bytes(back[:1 << 20]), chunk_bytes(5, 1 << 20))
        self.assertEqual(bytes(back[n - 4096:]), chunk_bytes(6, 4096))
        self.assertEqual(bytes(back[1 << 20:2 << 20]), bytes(1 << 20))

    def test_corrupted_object_on_ssd_fails_and_is_removed(self):
        cfg, data = ssd_config(self.tmp.name)
        saved = child("save", cfg, "ns", "c", 3, seed=7)
        self.assertEqual(saved["set"][2], [True] * 3)
        # flip one byte of the second chunk's bytes in the tier's file
        files = glob.glob(os.path.join(data, "kvstrata-*.data"))
        self.assertEqual(len(files), 1, files)
        needle = chunk_bytes(8)[1000:1064]
        with open(files[0], "r+b") as f:
            raw = f.read()
            at = raw.find(needle)
            self.assertGreaterEqual(at, 0, "chunk bytes not found in the tier's file")
            self.assertEqual(raw.find(needle, at + 1), -1)
            f.seek(at + 10)
            f.write(bytes([raw[at + 10] ^ 0x40]))
        back = child("load", cfg, "ns", "c", 3)
        self.assertEqual(back["get"][2], [True, False, True])
        self.assertEqual(back["digests"][0], sha(chunk_bytes(7)))
        self.assertEqual(back["digests"][2], sha(chunk_bytes(9)))
        # removed: the reader's own exists after the get, and a later process
        self.assertEqual(back["exists"][2], [True, False, True])
        again = child("load", cfg, "ns", "c", 3)
        self.assertEqual(again["exists"][2], [True, False, True])
        self.assertEqual(again["get"][2], [True, False, True])

    def test_concurrent_submits_from_threads(self):
        d = self.open(threads=4)
        errors = []

        def worker(t):
            try:
                keys = keys_for("t%d" % t, 8)
                views = []
                for i in range(8):
                    v = byte_array(CHUNK)
                    v[:] = chunk_bytes(1000 * t + i)
                    views.append(v)
                fids = [d.set(keys[:4], views[:4]), d.set(keys[4:], views[4:])]
                for fid in fids:
                    ok, error, per_key = d.result(fid)
                    assert ok and per_key == [True] * 4, (ok, error, per_key)
                outs = [byte_array(CHUNK) for _ in keys]
                fids = [d.get([k], [o]) for k, o in zip(keys, outs)]
                for fid in fids:
                    assert d.result(fid)[2] == [True]
                for i, o in enumerate(outs):
                    assert bytes(o) == chunk_bytes(1000 * t + i), (t, i)
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(e)

        threads = [threading.Thread(target=worker, args=(t,)) for t in range(6)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(120)
        self.assertEqual(errors, [])
        self.assertEqual(d.unknown, [])
        self.assertEqual(d.pending, {})

    def test_two_tenants_are_isolated(self):
        shm = "kvs-lmc-" + uuid.uuid4().hex[:12]
        cfg = dram_config(self.tmp.name, shm_name=shm)
        a = self.open(cfg, tenant="team-a")
        b = self.open(cfg, tenant="team-b")
        keys = keys_for("same", 1)
        va = byte_array(CHUNK)
        va[:] = chunk_bytes(1)
        self.assertEqual(a.run("set", keys, [va])[2], [True])
        self.assertEqual(b.run("exists", keys)[2], [False])
        self.assertEqual(b.run("get", keys, [byte_array(CHUNK)])[2], [False])
        vb = byte_array(CHUNK)
        vb[:] = chunk_bytes(2)
        self.assertEqual(b.run("set", keys, [vb])[2], [True])
        for d, seed in ((a, 1), (b, 2)):
            out = byte_array(CHUNK)
            self.assertEqual(d.run("get", keys, [out])[2], [True])
            self.assertEqual(bytes(out), chunk_bytes(seed))
        # a tenant's delete leaves the other's object
        self.assertEqual(b.run("delete", keys)[2], [True])
        self.assertEqual(a.run("exists", keys)[2], [True])
        # and a child process of tenant team-a finds team-a's chunk only
        back = child("load", cfg, "ns-bf16-256", "same", 1, tenant="team-a")
        self.assertEqual(back["digests"], [sha(chunk_bytes(1))])
        back = child("load", cfg, "ns-bf16-256", "same", 1, tenant="team-c")
        self.assertEqual(back["get"][2], [False])

    def test_eventfd_completion_path(self):
        client = lmcache.KvstrataNativeConnector(namespace="ns")
        self.addCleanup(client.close)
        fd = client.event_fd()
        self.assertEqual(select.select([fd], [], [], 0)[0], [])
        self.assertEqual(client.drain_completions(), [])
        keys = keys_for("fd", 3)
        views = [byte_array(CHUNK, i + 1) for i in range(3)]
        fid = client.submit_batch_set(keys, views)
        got = []
        while not got:
            self.assertEqual(select.select([fd], [], [], 10)[0], [fd], "event fd never readable")
            got = client.drain_completions()
        self.assertEqual(got, [(fid, True, "", [True] * 3)])
        # drained: the fd sleeps until the next completion
        self.assertEqual(select.select([fd], [], [], 0.05)[0], [])
        f1 = client.submit_batch_exists(keys + keys_for("none", 1))
        f2 = client.submit_batch_get(keys[2:], [byte_array(CHUNK)])
        self.assertNotEqual(f1, f2)
        seen = {}
        while len(seen) < 2:
            self.assertEqual(select.select([fd], [], [], 10)[0], [fd])
            for c in client.drain_completions():
                seen[c[0]] = c[1:]
        self.assertEqual(seen[f1], (True, "", [True, True, True, False]))
        self.assertEqual(seen[f2], (True, "", [True]))
        self.assertEqual(select.select([fd], [], [], 0.05)[0], [])

    def test_delete(self):
        d = self.open()
        keys = keys_for("del", 3)
        d.run("set", keys[:2], [byte_array(CHUNK, 1), byte_array(CHUNK, 2)])
        self.assertEqual(d.run("delete", keys), (True, "", [True, True, False]))
        self.assertEqual(d.run("exists", keys)[2], [False, False, False])
        self.assertEqual(d.run("get", keys[:1], [byte_array(CHUNK)])[2], [False])

    def test_bad_calls_raise_and_start_nothing(self):
        d = self.open()
        with self.assertRaises(ValueError):
            d.client.submit_batch_set(keys_for("x", 2), [byte_array(CHUNK)])
        with self.assertRaises(ValueError):
            d.client.submit_batch_exists([])
        d.client.close()
        with self.assertRaises(RuntimeError):
            d.client.submit_batch_exists(keys_for("x", 1))
        self.assertEqual(d.client.drain_completions(), [])


class Chunk(standin.MemoryObj):
    """A tensor-backed LMCache memory object."""

    def __init__(self, shape, dtype, fmt, pool):
        self.tensor = torch.zeros(shape, dtype=dtype)
        self.fmt = fmt
        self.pool = pool
        self.refs = 1

    @property
    def byte_array(self):
        return memoryview(self.tensor.view(-1).view(torch.uint8).numpy())

    def get_size(self):
        return self.tensor.numel() * self.tensor.element_size()

    def get_shape(self):
        return self.tensor.shape

    def get_dtype(self):
        return self.tensor.dtype

    def get_memory_format(self):
        return self.fmt

    def ref_count_down(self):
        self.refs -= 1
        if self.refs == 0:
            self.pool.live.remove(self)


class Allocator(standin.LocalCPUBackend):
    def __init__(self):
        self.live = []

    def allocate(self, shape, dtype, fmt=None):
        c = Chunk(shape, dtype, fmt, self)
        self.live.append(c)
        return c


class RemoteConnectorReplay(unittest.TestCase):
    """LMCache's remote backend: coroutines on a loop in another thread, sync calls from this one."""

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="kvs-lmc-")
        self.addCleanup(self.tmp.cleanup)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.shm = "kvs-lmc-" + uuid.uuid4().hex[:12]
        self.cfg = dram_config(self.tmp.name, shm_name=self.shm)
        self.alloc = Allocator()
        self.conns = []

    def tearDown(self):
        for c in self.conns:
            self.call(c.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()

    def call(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)

    def connect(self, tenant=None, url=None):
        url = url or "kvstrata://local:0/?config=%s&namespace=lmc-test&max_value_bytes=1048576" % self.cfg
        if tenant:
            url += "&tenant=" + tenant
        ctx = standin.ConnectorContext(url, self.loop, self.alloc, None, None)
        c = lmcache.KvstrataConnectorAdapter().create_connector(ctx)
        self.conns.append(c)
        return c

    def chunk(self, seed, tokens=16, fmt=3):
        c = self.alloc.allocate((2, 4, tokens, 64), torch.bfloat16, fmt)
        c.byte_array[:] = chunk_bytes(seed, c.get_size())
        return c

    def key(self, i, worker=0):
        return standin.CacheEngineKey("llama-3-8b", 1, worker, "%x" % (0xabc000 + i), "bfloat16")

    def test_list_keeps_the_most_recent_keys_only(self):
        # a server puts chunks for months: list names the most recent, not every key ever put
        c = self.connect()
        c._stored.limit = 2
        keys = [self.key(i) for i in range(3)]
        self.call(c.batched_put(keys, [self.chunk(i) for i in range(3)]))
        self.assertEqual(self.call(c.list()), sorted(k.to_string() for k in keys[1:]))
        self.assertTrue(c.exists_sync(keys[0]), "forgotten by list, still stored")

    def test_put_get_exists_list_remove(self):
        c = self.connect()
        keys = [self.key(i) for i in range(4)]
        objs = [self.chunk(i) for i in range(3)] + [self.chunk(3, tokens=5, fmt=1)]
        self.call(c.batched_put(keys[:3], objs[:3]))
        self.call(c.put(keys[3], objs[3]))
        self.assertTrue(self.call(c.exists(keys[0])))
        self.assertTrue(c.exists_sync(keys[3]))
        self.assertFalse(c.exists_sync(self.key(99)))
        self.assertEqual(c.batched_contains([keys[0], self.key(99), keys[2]]), [True, False, False])
        self.assertEqual(c.batched_contains([keys[0], self.key(99), keys[2]],
                                            stop_after_first_not_exits=False), [True, False, True])
        self.assertEqual(self.call(c.batched_async_contains("l1", keys + [self.key(99)], True)), 4)
        got = self.call(c.batched_get(keys + [self.key(99)]))
        self.assertIsNone(got[4])
        for o, g in zip(objs, got):
            self.assertEqual(tuple(g.get_shape()), tuple(o.get_shape()))
            self.assertEqual(g.get_dtype(), torch.bfloat16)
            self.assertEqual(g.get_memory_format(), o.get_memory_format())
            self.assertEqual(bytes(g.byte_array), bytes(o.byte_array))
        one = self.call(c.get(keys[3]))
        self.assertEqual(tuple(one.get_shape()), (2, 4, 5, 64))
        self.assertIsNone(self.call(c.get(self.key(99))))
        self.assertEqual(self.call(c.list()), sorted(k.to_string() for k in keys))
        self.assertTrue(c.remove_sync(keys[1]))
        self.assertFalse(c.remove_sync(keys[1]))
        self.assertFalse(c.exists_sync(keys[1]))
        self.assertEqual(self.call(c.list()), sorted(k.to_string() for k in keys if k != keys[1]))
        prefix = self.call(c.batched_get_non_blocking("l2", keys))
        self.assertEqual(len(prefix), 1)
        self.assertEqual(bytes(prefix[0].byte_array), bytes(objs[0].byte_array))

    def test_another_process_reads_what_this_one_put(self):
        c = self.connect()
        self.call(c.batched_put([self.key(7)], [self.chunk(7)]))
        script = r"""
import asyncio, sys, torch
sys.path.insert(0, %r)
from test_lmcache_adapter import Allocator, chunk_bytes
from kvstrata import _lmcache_standin as standin, lmcache
ctx = standin.ConnectorContext(sys.argv[1], None, Allocator(), None, None)
async def main():
    c = lmcache.KvstrataConnectorAdapter().create_connector(ctx)
    key = standin.CacheEngineKey("llama-3-8b", 1, 0, "%%x" %% (0xabc000 + 7), "bfloat16")
    g = await c.get(key)
    await c.close()
    print(bytes(g.byte_array) == chunk_bytes(7, g.get_size()), tuple(g.get_shape()))
asyncio.run(main())
""" % HERE
        env = dict(os.environ)
        env["PYTHONPATH"] = PYDIR + os.pathsep + env.get("PYTHONPATH", "")
        url = "kvstrata://local:0/?config=%s&namespace=lmc-test&max_value_bytes=1048576" % self.cfg
        p = subprocess.run([PYTHON, "-c", script, url], env=env, capture_output=True, text=True,
                           timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr[-3000:])
        self.assertEqual(p.stdout.split(), ["True", "(2,", "4,", "16,", "64)"])

    def test_corrupted_object_is_a_miss_and_removed(self):
        c = self.connect()
        keys = [self.key(i) for i in range(2)]
        self.call(c.batched_put(keys, [self.chunk(20), self.chunk(21)]))
        needle = chunk_bytes(21, 2 * 4 * 16 * 64 * 2)[500:564]
        path = os.path.join("/dev/shm", self.shm)
        with open(path, "r+b") as f:
            raw = f.read()
            at = raw.find(needle)
            self.assertGreaterEqual(at, 0)
            f.seek(at)
            f.write(bytes([raw[at] ^ 0xFF]))
        live = len(self.alloc.live)
        got = self.call(c.batched_get(keys))
        self.assertIsNotNone(got[0])
        self.assertIsNone(got[1])
        self.assertEqual(len(self.alloc.live), live + 1)  # the damaged one's memory went back
        self.assertFalse(c.exists_sync(keys[1]))
        self.assertTrue(c.exists_sync(keys[0]))
        self.assertEqual(self.call(c.list()), [keys[0].to_string()])

    def test_tenants_and_workers_are_apart(self):
        a = self.connect(tenant="a")
        b = self.connect(tenant="b")
        self.call(a.put(self.key(1), self.chunk(1)))
        self.assertFalse(b.exists_sync(self.key(1)))
        self.assertIsNone(self.call(b.get(self.key(1))))
        self.assertFalse(a.exists_sync(self.key(1, worker=1)))  # the key carries the worker

    def test_the_limit_is_one_chunk_of_lmcaches_metadata(self):
        class Meta:
            kv_shape = (8, 2, 256, 8, 128)  # 8 MiB in bf16, above the store's own default
            kv_dtype = torch.bfloat16
            chunk_size = 256
            use_mla = False

        self.assertEqual(lmcache.chunk_bytes_from_metadata(Meta()), 8 << 20)
        self.assertEqual(lmcache.chunk_bytes_from_metadata(None), 0)
        url = "kvstrata://local:0/?config=%s&namespace=lmc-meta" % self.cfg  # no max_value_bytes
        ctx = standin.ConnectorContext(url, self.loop, self.alloc, None, Meta())
        c = lmcache.KvstrataConnectorAdapter().create_connector(ctx)
        self.conns.append(c)
        self.assertEqual(c.max_value_bytes, 8 << 20)
        whole = self.alloc.allocate((2, 8, 256, 1024), torch.bfloat16, 3)  # one whole chunk
        whole.byte_array[:4096] = chunk_bytes(9, 4096)
        self.call(c.put(self.key(40), whole))
        got = self.call(c.get(self.key(40)))
        self.assertEqual(bytes(got.byte_array), bytes(whole.byte_array))
        over = self.alloc.allocate((2, 8, 260, 1024), torch.bfloat16, 3)
        with self.assertLogs("kvstrata.lmcache", "WARNING"):
            with self.assertRaises(RuntimeError) as cm:
                self.call(c.put(self.key(41), over))
        self.assertIn("larger than max_value_bytes (8388608)", str(cm.exception))
        self.assertFalse(c.exists_sync(self.key(41)))

    def test_namespace_from_metadata(self):
        class Meta:
            kv_shape = (32, 2, 256, 8, 128)
            chunk_size = 256
            use_mla = False

        ns = lmcache._namespace_from_metadata(Meta())
        self.assertIn("kv_shape=(32, 2, 256, 8, 128)", ns)
        self.assertIn("chunk_size=256", ns)
        self.assertNotEqual(ns, lmcache._namespace_from_metadata(None))


if __name__ == "__main__":
    unittest.main()
