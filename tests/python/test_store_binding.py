"""kvstrata.store: the store API (abi/kvstrata_store.h) through its ctypes binding. Values go in and
come back byte for byte from bytearrays, numpy arrays, tensors, bytes and scatter-gather lists;
exists answers the leading run; misses, skipped puts, overwrites, removes and a value larger than
its buffers say so per key; tenants and namespaces never meet on one shared DRAM tier; the event fd
wakes a poller; eight threads at once stay byte-exact; a second process reads what this one put
through a shared DRAM tier; an SSD tier serves a value after a restart and reports an object damaged
on disk as KVS_ECORRUPT, then no longer has it.

Every value is a function of its key (value_of), so any successful get can be checked."""

import ctypes
import hashlib
import os
import select
import shutil
import struct
import subprocess
import tempfile
import threading
import time
import types
import unittest
import uuid

import numpy
import torch

from kvstrata import _abi
from kvstrata._abi_types import ECORRUPT, EINVAL, ENOTFOUND, EOVERFLOW, OK, EVENT_STORED
from kvstrata.store import ABSENT, PRESENT, SKIPPED, Store, StoreError, StoreTimeout

MiB = 1 << 20
HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON_DIR = os.path.join(os.path.dirname(os.path.dirname(HERE)), "python")


def value_of(key, n):
    """n bytes determined by key (and n)."""
    if isinstance(key, str):
        key = key.encode()
    return hashlib.shake_128(key + n.to_bytes(8, "little")).digest(n)


def namespace():
    return "test-store/" + uuid.uuid4().hex


class TmpDir:
    def tmpdir(self):
        d = tempfile.mkdtemp(prefix="kvs-store-")
        self.addCleanup(shutil.rmtree, d, True)
        return d

    def yaml(self, text):
        path = os.path.join(self.tmpdir(), "store.yaml")
        with open(path, "w") as f:
            f.write(text)
        return path

    def shared_dram(self):
        """A config with one DRAM tier in a POSIX shared memory object of its own name."""
        name = "kvs-store-test-" + uuid.uuid4().hex[:12]
        self.addCleanup(lambda: os.path.exists("/dev/shm/" + name) and os.unlink("/dev/shm/" + name))
        return self.yaml("version: 1\ntiers:\n  - name: dram\n    type: dram\n"
                         f"    capacity: 64MiB\n    options:\n      shm_name: {name}\n")

    def ssd(self, directory):
        return self.yaml("version: 1\ntiers:\n  - name: nvme\n    type: ssd\n"
                         f"    capacity: 64MiB\n    paths: [{directory}]\n")


class RoundTrips(TmpDir, unittest.TestCase):
    def setUp(self):
        self.s = Store(namespace(), max_value_bytes=MiB)
        self.addCleanup(self.s.close)

    def test_bytearrays_round_trip_byte_for_byte(self):
        keys = [b"page-%d" % i for i in range(6)]
        vals = [value_of(k, 4096 + 17 * i) for i, k in enumerate(keys)]
        put = self.s.put(keys, [bytearray(v) for v in vals])
        self.assertEqual([r.status for r in put], [OK] * 6)
        self.assertEqual([r.flags & SKIPPED for r in put], [0] * 6)
        self.assertEqual([r.tier for r in put], [0] * 6)
        out = [bytearray(len(v)) for v in vals]
        got = self.s.get(keys, out)
        self.assertEqual([r.status for r in got], [OK] * 6)
        self.assertEqual([r.bytes for r in got], [len(v) for v in vals])
        self.assertEqual([bytes(o) for o in out], vals)
        st = self.s.stats()
        self.assertEqual((st["puts_stored"], st["get_hits"], st["get_misses"]), (6, 6, 0))
        self.assertEqual(st["get_bytes"], sum(len(v) for v in vals))

    def test_str_keys_are_their_utf8_bytes(self):
        v = value_of("clé", 100)
        self.s.put(["clé"], [v])
        out = bytearray(100)
        self.assertEqual(self.s.get(["clé".encode()], [out])[0].status, OK)
        self.assertEqual(bytes(out), v)

    def test_three_segments_per_key_scatter_and_gather(self):
        keys = [b"sg-a", b"sg-b", b"sg-c"]
        n = 3000
        vals = [value_of(k, n) for k in keys]
        # put from three kinds of pieces: bytes, a bytearray, a numpy array (cuts 1000/700/1300)
        bufs = [[v[:1000], bytearray(v[1000:1700]), numpy.frombuffer(v[1700:], numpy.uint8).copy()]
                for v in vals]
        self.assertEqual([r.status for r in self.s.put(keys, bufs)], [OK] * 3)
        # get into three other cuts (1, 2048, 951): a numpy array, a bytearray, a memoryview slice
        backing = [bytearray(2000) for _ in keys]
        outs = [[numpy.zeros(1, numpy.uint8), bytearray(2048), memoryview(b)[1000:1951]]
                for b in backing]
        got = self.s.get(keys, outs)
        self.assertEqual([(r.status, r.bytes) for r in got], [(OK, n)] * 3)
        for v, (a, b, c) in zip(vals, outs):
            self.assertEqual(a.tobytes() + bytes(b) + bytes(c), v)

    def test_numpy_tensor_ctypes_and_address_buffers(self):
        keys = [b"np", b"torch", b"ctypes", b"addr"]
        n = 512
        vals = [value_of(k, n) for k in keys]
        src_np = numpy.frombuffer(vals[0], numpy.float32).copy()
        src_t = torch.frombuffer(bytearray(vals[1]), dtype=torch.int16)
        src_c = (ctypes.c_uint8 * n).from_buffer_copy(vals[2])
        src_a = ctypes.create_string_buffer(vals[3], n)
        self.s.put(keys, [src_np, src_t, src_c, (ctypes.addressof(src_a), n)])
        out_np = numpy.zeros(n // 8, numpy.float64)
        out_t = torch.zeros(n // 4, dtype=torch.int32)
        out_c = (ctypes.c_char * n)()
        out_a = ctypes.create_string_buffer(n)
        got = self.s.get(keys, [out_np, out_t, out_c, (ctypes.addressof(out_a), n)])
        self.assertEqual([r.status for r in got], [OK] * 4)
        self.assertEqual(out_np.tobytes(), vals[0])
        self.assertEqual(out_t.numpy().tobytes(), vals[1])
        self.assertEqual(bytes(out_c), vals[2])
        self.assertEqual(out_a.raw, vals[3])

    def test_a_get_buffer_must_be_writable(self):
        with self.assertRaises(TypeError):
            self.s.submit_get([b"k"], [b"read-only"])
        ro = numpy.zeros(8, numpy.uint8)
        ro.flags.writeable = False
        with self.assertRaises(TypeError):
            self.s.submit_get([b"k"], [ro])
        with self.assertRaises(ValueError):
            self.s.submit_get([b"k", b"l"], [bytearray(8)])

    def test_exists_answers_the_leading_run_and_every_key_with_all(self):
        keys = [b"e0", b"e1", b"e2", b"e3", b"e4"]
        self.s.put([keys[0], keys[1], keys[3]], [value_of(k, 64) for k in (keys[0], keys[1], keys[3])])
        n, states = self.s.exists(keys)
        self.assertEqual(n, 2)
        self.assertEqual(states[:2], [PRESENT, PRESENT])
        self.assertLessEqual(len(states), 3)  # up to the first absent key
        if len(states) == 3:
            self.assertEqual(states[2], ABSENT)
        n, states = self.s.exists(keys, all=True)
        self.assertEqual((n, states), (2, [PRESENT, PRESENT, ABSENT, PRESENT, ABSENT]))
        n, states = self.s.exists([keys[2], keys[0]], all=True)
        self.assertEqual((n, states), (0, [ABSENT, PRESENT]))
        # the batch form: OK present, ENOTFOUND absent
        res = self.s.wait(self.s.submit_exists(keys))
        self.assertEqual([r.status for r in res], [OK, OK, ENOTFOUND, OK, ENOTFOUND])

    def test_pins_then_gets_and_unpin(self):
        keys = [b"p0", b"p1"]
        self.s.put(keys, [value_of(k, 100) for k in keys])
        n, _ = self.s.exists(keys, pin_ms=5000)
        self.assertEqual(n, 2)
        out = [bytearray(100), bytearray(100)]
        self.assertEqual([r.status for r in self.s.get(keys, out)], [OK, OK])
        self.assertEqual([bytes(o) for o in out], [value_of(k, 100) for k in keys])
        self.s.unpin(keys)

    def test_misses_fail_alone(self):
        self.s.put([b"here"], [value_of(b"here", 50)])
        out = [bytearray(50), bytearray(50), bytearray(50)]
        got = self.s.get([b"nope", b"here", b"nor-this"], out)
        self.assertEqual([r.status for r in got], [ENOTFOUND, OK, ENOTFOUND])
        self.assertEqual(bytes(out[1]), value_of(b"here", 50))
        self.assertEqual(self.s.stats()["get_misses"], 2)

    def test_a_present_key_is_skipped_unless_overwrite(self):
        first, second = value_of(b"one", 80), value_of(b"two", 80)
        self.assertEqual(self.s.put([b"k"], [first])[0].flags & SKIPPED, 0)
        r = self.s.put([b"k"], [second])[0]
        self.assertEqual((r.status, r.flags & SKIPPED), (OK, SKIPPED))
        out = bytearray(80)
        self.s.get([b"k"], [out])
        self.assertEqual(bytes(out), first)  # nothing was written
        r = self.s.put([b"k"], [second], overwrite=True)[0]
        self.assertEqual((r.status, r.flags & SKIPPED), (OK, 0))
        self.s.get([b"k"], [out])
        self.assertEqual(bytes(out), second)
        # a value of another length replaces it too
        third = value_of(b"three", 33)
        self.s.put([b"k"], [third], overwrite=True)
        out = bytearray(100)
        r = self.s.get([b"k"], [out])[0]
        self.assertEqual((r.status, r.bytes, bytes(out[:33])), (OK, 33, third))
        self.assertEqual(self.s.stats()["puts_skipped"], 1)

    def test_remove(self):
        keys = [b"r0", b"r1"]
        self.s.put(keys, [value_of(k, 10) for k in keys])
        self.assertEqual(self.s.remove([b"r0"])[0].status, OK)
        self.assertEqual(self.s.exists(keys, all=True), (0, [ABSENT, PRESENT]))
        got = self.s.get(keys, [bytearray(10), bytearray(10)])
        self.assertEqual([r.status for r in got], [ENOTFOUND, OK])

    def test_a_value_larger_than_its_buffers_is_eoverflow_with_the_bytes_needed(self):
        v = value_of(b"big", 10000)
        self.s.put([b"big", b"small"], [v, value_of(b"small", 10)])
        got = self.s.get([b"big", b"small"], [[bytearray(4096), bytearray(4096)], bytearray(10)])
        self.assertEqual((got[0].status, got[0].bytes), (EOVERFLOW, 10000))
        self.assertEqual((got[1].status, got[1].bytes), (OK, 10))

    def test_bad_keys_are_einval_and_start_nothing(self):
        for keys in ([b""], [b"x" * 1025]):
            with self.assertRaises(StoreError) as cm:
                self.s.submit_put(keys, [b"v"])
            self.assertEqual(cm.exception.status, EINVAL)
            self.assertIsInstance(cm.exception, _abi.KvsError)
        self.assertEqual(self.s.stats()["batches_in_flight"], 0)
        self.s.put([b"x" * 1024], [b"v"])  # the longest key is fine

    def test_wait_on_an_unknown_ticket_is_enotfound_and_a_collected_one_too(self):
        with self.assertRaises(StoreError) as cm:
            self.s.wait(987654321)
        self.assertEqual(cm.exception.status, ENOTFOUND)
        t = self.s.submit_put([b"w"], [b"v"])
        self.assertEqual(self.s.wait(t)[0].status, OK)
        with self.assertRaises(StoreError) as cm:
            self.s.wait(t, 0)
        self.assertEqual(cm.exception.status, ENOTFOUND)

    def test_the_event_fd_wakes_a_poller_and_drain_returns_the_ticket(self):
        fd = self.s.event_fd()
        self.assertGreaterEqual(fd, 0)
        self.s.drain()
        try:  # start from a reset fd
            os.read(fd, 8)
        except BlockingIOError:
            pass
        buf = bytearray(value_of(b"ev", 2048))
        t = self.s.submit_put([b"ev"], [buf])
        readable, _, _ = select.select([fd], [], [], 10)
        self.assertEqual(readable, [fd])
        tickets = []
        deadline = time.monotonic() + 10
        while t not in tickets and time.monotonic() < deadline:
            tickets += self.s.drain()
            if t not in tickets:
                select.select([fd], [], [], 0.1)
        self.assertIn(t, tickets)
        res = self.s.wait(t, 0)  # done: collected at once
        self.assertEqual([(r.status, r.flags) for r in res], [(OK, 0)])

    def test_usage_names_the_tier_and_counts_this_stores_traffic(self):
        self.s.put([b"u0", b"u1"], [value_of(b"u0", 300), value_of(b"u1", 200)])
        self.s.get([b"u0"], [bytearray(300)])
        u = self.s.usage()
        self.assertEqual(len(u), 1)
        self.assertEqual(u[0].name, "dram")
        self.assertEqual((u[0].puts, u[0].put_bytes, u[0].hits, u[0].hit_bytes), (2, 500, 1, 300))
        self.assertGreaterEqual(u[0].objects, 2)
        self.assertEqual(self.s.stats()["n_tiers"], 1)


class FakeDeviceTensor:
    """What a CUDA tensor shows the binding (data_ptr, numel, element_size, nbytes, device,
    is_cuda), over host memory here so that a binding taking it would not crash the test."""

    def __init__(self, n, device_type="cuda", is_cuda=True):
        self.host = (ctypes.c_uint8 * n)()
        self.nbytes = n
        self.device = types.SimpleNamespace(type=device_type)
        if is_cuda is not None:
            self.is_cuda = is_cuda

    def data_ptr(self):
        return ctypes.addressof(self.host)

    def numel(self):
        return self.nbytes

    def element_size(self):
        return 1

    def is_contiguous(self):
        return True


class Boundaries(unittest.TestCase):
    def setUp(self):
        self.s = Store(namespace(), max_value_bytes=4 * MiB)
        self.addCleanup(self.s.close)

    def test_a_timed_out_get_hands_back_its_ticket_and_wait_collects_it(self):
        keys = [b"big-%d" % i for i in range(16)]
        vals = [value_of(k, 4 * MiB) for k in keys]
        self.assertEqual([r.status for r in self.s.put(keys, vals)], [OK] * 16)
        outs = [bytearray(4 * MiB) for _ in keys]  # 64 MiB: not copied within 0 ms
        with self.assertRaises(StoreTimeout) as cm:
            self.s.get(keys, outs, timeout_ms=0)
        self.assertIsInstance(cm.exception, TimeoutError)
        got = self.s.wait(cm.exception.ticket)
        self.assertEqual([(r.status, r.bytes) for r in got], [(OK, 4 * MiB)] * 16)
        self.assertTrue(all(bytes(o) == v for o, v in zip(outs, vals)))
        with self.assertRaises(StoreError) as again:  # collected once
            self.s.wait(cm.exception.ticket, 0)
        self.assertEqual(again.exception.status, ENOTFOUND)

    def test_a_put_that_times_out_is_collected_through_its_ticket(self):
        keys = [b"put-%d" % i for i in range(16)]
        vals = [bytearray(value_of(k, 4 * MiB)) for k in keys]
        with self.assertRaises(StoreTimeout) as cm:
            self.s.put(keys, vals, timeout_ms=0)
        self.assertEqual([r.status for r in self.s.wait(cm.exception.ticket)], [OK] * 16)
        out = bytearray(4 * MiB)
        self.assertEqual(self.s.get([keys[7]], [out])[0].status, OK)
        self.assertEqual(bytes(out), bytes(vals[7]))

    def test_a_tensor_on_a_device_is_refused_before_anything_is_submitted(self):
        self.s.put([b"dev"], [value_of(b"dev", 256)])
        before = self.s.stats()
        for fake in (FakeDeviceTensor(256), FakeDeviceTensor(256, "cuda", None),
                     FakeDeviceTensor(256, "cpu", True)):
            with self.assertRaises(ValueError) as cm:
                self.s.submit_get([b"dev"], [fake])
            self.assertIn("host memory", str(cm.exception))
            with self.assertRaises(ValueError):
                self.s.submit_put([b"dev2"], [[bytearray(8), fake]])
            self.assertEqual(bytes(fake.host), bytes(256))  # nothing was written into it
        after = self.s.stats()
        self.assertEqual((after["gets"], after["puts"]), (before["gets"], before["puts"]))
        self.assertEqual(after["batches_in_flight"], 0)
        host = FakeDeviceTensor(256, "cpu", False)  # the same object in host memory is taken
        self.assertEqual(self.s.get([b"dev"], [host])[0].status, OK)
        self.assertEqual(bytes(host.host), value_of(b"dev", 256))


class Defaults(unittest.TestCase):
    def test_the_default_tier_holds_many_small_values(self):
        # No config: one 1 GiB DRAM tier, which gives every value a slab of max_value_bytes and a
        # 4 KiB header. With the limit at the values' size, 400 values of 1000 bytes (5 KiB slabs,
        # 2 MiB in all) must all stay.
        keys = [b"d-%d" % i for i in range(400)]
        with Store(namespace(), max_value_bytes=1000) as s:
            for i in range(0, 400, 8):
                res = s.put(keys[i:i + 8], [value_of(k, 1000) for k in keys[i:i + 8]])
                self.assertEqual([r.status for r in res], [OK] * 8)
            n, states = s.exists(keys, all=True)
            self.assertEqual(states.count(PRESENT), 400, s.usage())
            self.assertEqual(n, 400)
            # a value over the limit is that key's EINVAL, the others are stored
            res = s.put([b"big", b"small"], [b"x" * 1001, b"y" * 10])
            self.assertEqual([r.status for r in res], [EINVAL, OK])


class Events(unittest.TestCase):
    def test_a_put_is_an_event_with_the_engine_key(self):
        with Store(namespace(), event_capacity=16) as s:
            s.put([b"ek0", b"ek1"], [b"a" * 10, b"b" * 20])
            ev = s.take_events()
            stored = [e for e in ev if e.kind == EVENT_STORED]
            self.assertEqual(sorted(e.key for e in stored), [b"ek0", b"ek1"])
            self.assertEqual(len({e.key16 for e in stored}), 2)
            self.assertEqual(s.take_events(), [])

    def test_a_closed_store_refuses_calls(self):
        s = Store(namespace())
        s.close()
        s.close()
        with self.assertRaises(StoreError):
            s.exists([b"k"])


class Isolation(TmpDir, unittest.TestCase):
    """Two stores on one shared DRAM tier: the same key under another tenant or namespace misses,
    and under the same tenant and namespace hits (so the miss is isolation, not two tiers)."""

    def test_two_tenants_never_meet(self):
        cfg, ns = self.shared_dram(), namespace()
        v = value_of(b"t", 500)
        with Store(ns, tenant="alice", config=cfg, max_value_bytes=MiB) as a, \
                Store(ns, tenant="bob", config=cfg, max_value_bytes=MiB) as b, \
                Store(ns, tenant="alice", config=cfg, max_value_bytes=MiB) as a2:
            a.put([b"shared-key"], [v])
            self.assertEqual(b.exists([b"shared-key"]), (0, [ABSENT]))
            self.assertEqual(b.get([b"shared-key"], [bytearray(500)])[0].status, ENOTFOUND)
            out = bytearray(500)
            self.assertEqual(a2.get([b"shared-key"], [out])[0].status, OK)
            self.assertEqual(bytes(out), v)
            # bob's own value under the same key stays his
            w = value_of(b"bob", 500)
            self.assertEqual(b.put([b"shared-key"], [w])[0].flags & SKIPPED, 0)
            b.get([b"shared-key"], [out])
            self.assertEqual(bytes(out), w)
            a.get([b"shared-key"], [out])
            self.assertEqual(bytes(out), v)

    def test_two_namespaces_never_meet(self):
        cfg = self.shared_dram()
        ns1, ns2 = namespace(), namespace()
        v = value_of(b"n", 300)
        with Store(ns1, config=cfg, max_value_bytes=MiB) as one, \
                Store(ns2, config=cfg, max_value_bytes=MiB) as two, \
                Store(ns1.encode(), config=cfg, max_value_bytes=MiB) as one_again:
            one.put([b"k"], [v])
            self.assertEqual(two.exists([b"k"]), (0, [ABSENT]))
            self.assertEqual(two.get([b"k"], [bytearray(300)])[0].status, ENOTFOUND)
            out = bytearray(300)
            self.assertEqual(one_again.get([b"k"], [out])[0].status, OK)
            self.assertEqual(bytes(out), v)


class Threads(unittest.TestCase):
    def test_eight_threads_at_once_stay_byte_exact(self):
        shared = [b"shared-%d" % i for i in range(16)]
        errors = []
        counts = [0] * 8
        with Store(namespace(), threads=4, max_value_bytes=MiB) as s:
            def worker(w):
                try:
                    own = [b"own-%d-%d" % (w, i) for i in range(8)]
                    for it in range(25):
                        keys = own[it % 8:it % 8 + 2] + shared[(it + w) % 16:(it + w) % 16 + 2]
                        sizes = [1000 + (k[-1] * 13) % 3000 for k in keys]
                        res = s.put(keys, [value_of(k, n) for k, n in zip(keys, sizes)])
                        if any(r.status != OK for r in res):
                            errors.append(("put", w, it, res))
                        outs = [bytearray(n) for n in sizes]
                        t = s.submit_get(keys, outs)
                        for k, n, o, r in zip(keys, sizes, outs, s.wait(t)):
                            if r.status == OK:
                                counts[w] += 1
                                if r.bytes != n or bytes(o) != value_of(k, n):
                                    errors.append(("bytes", w, it, k))
                            elif k.startswith(b"own"):
                                errors.append(("own key missing", w, it, k, r))
                        if it % 5 == 0:
                            s.exists(keys)
                except Exception as e:  # a failure in a thread fails the test
                    errors.append(("raised", w, repr(e)))

            threads = [threading.Thread(target=worker, args=(w,)) for w in range(8)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(120)
            self.assertFalse(any(t.is_alive() for t in threads))
            self.assertEqual(errors, [])
            self.assertEqual(s.stats()["batches_in_flight"], 0)
        self.assertTrue(all(c >= 50 for c in counts), counts)


CHILD = r"""
import hashlib, sys
from kvstrata.store import Store
ns, tenant, cfg = sys.argv[1], sys.argv[2], sys.argv[3]
keys = [b"xp-%d" % i for i in range(5)]
with Store(ns, tenant=tenant, config=cfg, max_value_bytes=1 << 20) as s:
    outs = [bytearray(1000 + i) for i in range(5)]
    res = s.get(keys, outs)
    for k, o, r in zip(keys, outs, res):
        want = hashlib.shake_128(k + len(o).to_bytes(8, "little")).digest(len(o))
        print(k.decode(), r.status, int(bytes(o) == want))
"""


class TwoProcesses(TmpDir, unittest.TestCase):
    def test_a_second_process_reads_what_this_one_put_through_shared_dram(self):
        cfg, ns = self.shared_dram(), namespace()
        keys = [b"xp-%d" % i for i in range(5)]
        with Store(ns, tenant="t1", config=cfg, max_value_bytes=MiB) as s:
            s.put(keys[:4], [value_of(k, 1000 + i) for i, k in enumerate(keys[:4])])
            env = dict(os.environ, PYTHONPATH=PYTHON_DIR)
            out = subprocess.run(["/usr/bin/python3", "-c", CHILD, ns, "t1", cfg], env=env,
                                 capture_output=True, text=True, timeout=120)
            self.assertEqual(out.returncode, 0, out.stderr)
            lines = out.stdout.split("\n")[:5]
            self.assertEqual(lines, [f"xp-{i} 0 1" for i in range(4)] + [f"xp-4 {ENOTFOUND} 0"])
            # another tenant in the other process finds nothing
            out = subprocess.run(["/usr/bin/python3", "-c", CHILD, ns, "t2", cfg], env=env,
                                 capture_output=True, text=True, timeout=120)
            self.assertEqual(out.returncode, 0, out.stderr)
            self.assertEqual([ln.split()[1] for ln in out.stdout.split("\n")[:5]],
                             [str(ENOTFOUND)] * 5)


def _unit_headers(path):
    """(offset, data bytes) of every live unit header of an ssd tier's data file (docs/ssd.md)."""
    with open(path, "rb") as f:
        sb = f.read(4096)
        assert sb[:8] == b"KVSSSDF1", sb[:8]
        slot, n_slots = struct.unpack_from("<QQ", sb, 24)
        found = []
        for s in range(n_slots):
            off = 4096 + s * slot
            f.seek(off)
            h = f.read(96)
            if len(h) < 96:
                break
            if h[:8] == b"KVSSSDU1":
                found.append((off, struct.unpack_from("<I", h, 72)[0]))
        return found


class Ssd(TmpDir, unittest.TestCase):
    def test_a_value_survives_a_restart(self):
        d = self.tmpdir()
        cfg, ns = self.ssd(d), namespace()
        keys = [b"disk-0", b"disk-1"]
        vals = [value_of(k, 70000) for k in keys]
        with Store(ns, config=cfg, max_value_bytes=MiB) as s:
            self.assertEqual([r.status for r in s.put(keys, vals)], [OK, OK])
        with Store(ns, config=cfg, max_value_bytes=MiB) as s:
            self.assertEqual(s.exists(keys), (2, [PRESENT, PRESENT]))
            outs = [bytearray(70000), bytearray(70000)]
            got = s.get(keys, outs)
            self.assertEqual([(r.status, r.tier) for r in got], [(OK, 0), (OK, 0)])
            self.assertEqual([bytes(o) for o in outs], vals)
            self.assertEqual(s.usage()[0].name, "nvme")
        with Store(namespace(), config=cfg, max_value_bytes=MiB) as other:
            self.assertEqual(other.exists(keys), (0, [ABSENT]))

    def test_an_object_damaged_on_disk_is_ecorrupt_and_removed(self):
        d = self.tmpdir()
        cfg, ns = self.ssd(d), namespace()
        v = value_of(b"victim", 20000)
        with Store(ns, config=cfg, max_value_bytes=MiB) as s:
            s.put([b"victim"], [v])
        data = os.path.join(d, "kvstrata-nvme.data")
        units = _unit_headers(data)
        self.assertEqual(len(units), 1, units)
        off, n = units[0]
        self.assertGreater(n, 100)
        with open(data, "r+b") as f:  # one byte of the unit's data, after its 4 KiB header
            f.seek(off + 4096 + 100)
            b = f.read(1)
            f.seek(off + 4096 + 100)
            f.write(bytes([b[0] ^ 0x5A]))
        with Store(ns, config=cfg, max_value_bytes=MiB) as s:
            out = bytearray(20000)  # its bytes are undefined after a failed get
            r = s.get([b"victim"], [out])[0]
            self.assertEqual(r.status, ECORRUPT)
            self.assertEqual(s.exists([b"victim"], all=True), (0, [ABSENT]))
            self.assertGreaterEqual(s.stats()["corrupt"], 1)


if __name__ == "__main__":
    unittest.main()
