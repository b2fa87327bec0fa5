"""kvstrata._abi: the ctypes structs match abi/kvstrata.h (offsets pinned as tests/test_abi.c pins
them), statuses become exceptions carrying the handle's sentence, the library is found where the
docs say, and a handle of role BOTH saves and restores a prompt through host pages."""

import ctypes
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

from kvstrata import _abi

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE = os.path.join(os.path.dirname(os.path.dirname(HERE)), "python", "kvstrata")


def offsets(struct):
    return {name: (getattr(struct, name).offset, getattr(struct, name).size)
            for name, _t in struct._fields_}


class Layout(unittest.TestCase):
    """The same numbers tests/test_abi.c pins with _Static_assert (LP64)."""

    def test_model_desc(self):
        o = offsets(_abi.ModelDesc)
        self.assertEqual(o["model_id"], (8, 8))
        self.assertEqual(o["tp_size"], (44, 4))
        self.assertEqual(o["salt"], (48, 8))
        self.assertEqual(o["vocab_size"], (56, 4))
        self.assertEqual(ctypes.sizeof(_abi.ModelDesc), 64)
        self.assertEqual(o["vocab_size"][0], _abi.MODEL_DESC_SIZE_1_0)

    def test_small_structs(self):
        self.assertEqual(ctypes.sizeof(_abi.OpenParams), 32)
        self.assertEqual(offsets(_abi.OpenParams)["model"], (16, 8))
        self.assertEqual(offsets(_abi.OpenParams)["transfer_role"], (24, 4))  # 1.10
        self.assertEqual((_abi.TRANSFER_BOTH, _abi.TRANSFER_PRODUCER, _abi.TRANSFER_CONSUMER),
                         (0, 1, 2))
        self.assertEqual(ctypes.sizeof(_abi.LayerView), 56)
        self.assertEqual(offsets(_abi.LayerView)["head_stride"], (48, 8))
        self.assertEqual(ctypes.sizeof(_abi.LookupResult), 40)
        self.assertEqual(offsets(_abi.LookupResult)["load_async"], (17, 1))
        self.assertEqual(offsets(_abi.LookupResult)["n_lossy_tokens"], (24, 8))  # 1.6
        self.assertEqual(offsets(_abi.LookupResult)["chunk_tokens"], (32, 4))  # 1.10
        self.assertEqual(ctypes.sizeof(_abi.StepRequest), 56)
        self.assertEqual(offsets(_abi.StepRequest)["n_scheduled"], (48, 8))
        self.assertEqual(ctypes.sizeof(_abi.Event), 24)
        self.assertEqual(offsets(_abi.Event)["tier"], (20, 4))
        self.assertEqual(ctypes.sizeof(_abi.RestorePlan), 88)
        self.assertEqual(offsets(_abi.RestorePlan)["n_stages"], (48, 4))
        self.assertEqual(ctypes.sizeof(_abi.StageDesc), 48)

    def test_stats_with_the_1_5_fields(self):
        o = offsets(_abi.Stats)
        self.assertEqual(o["save_gbps"], (128, 8))
        self.assertEqual(o["n_tiers"], (136, 4))
        self.assertEqual(o["tier_chunks_loaded"], (144, 64))
        self.assertEqual(o["tokens_loaded"], (208, 8))
        self.assertEqual(o["tier_bytes_loaded"], (216, 64))
        self.assertEqual(o["tier_load_ns"], (280, 64))
        self.assertEqual(o["async_loads_started"], (344, 8))
        self.assertEqual(o["steps_closed"], (368, 8))
        self.assertEqual(o["lookups_unknown"], (376, 8))
        self.assertEqual(o["lossy_chunks_loaded"], (384, 8))  # 1.6
        self.assertEqual(o["saves_async"], (392, 8))  # 1.10
        self.assertEqual(o["saves_in_flight"], (400, 8))
        self.assertEqual(o["sends_reported"], (408, 8))
        self.assertEqual(o["integrity_rejects"], (416, 8))  # 1.11
        self.assertEqual(ctypes.sizeof(_abi.Stats), 424)

    def test_the_table_in_header_order(self):
        o = offsets(_abi.Api)
        expected = ["abi_major", "abi_minor", "struct_size", "reserved", "strerror", "open", "close",
                    "last_error", "lookup", "on_alloc", "build_meta", "request_finished",
                    "take_events", "register_kv", "bind_meta", "start_load", "wait_layer_load",
                    "save_layer", "wait_save", "get_finished", "load_error_blocks", "stats",
                    "set_stream", "set_plan_caps", "plan", "set_stages", "tier_name",
                    "load_dropped", "lsc_reserve", "lsc_fetch", "lsc_store", "sparse_begin",
                    "sparse_select", "sparse_wait", "sparse_stats", "sparse_end",
                    "request_key_input", "build_meta_update", "handle_info", "store_api"]
        self.assertEqual([n for n, _t in _abi.Api._fields_], expected)
        self.assertEqual(o["strerror"], (16, 8))
        self.assertEqual(o["stats"], (152, 8))
        self.assertEqual(o["tier_name"], (192, 8))
        self.assertEqual(o["load_dropped"], (200, 8))  # 1.7
        self.assertEqual(o["lsc_store"], (224, 8))  # 1.8
        self.assertEqual(o["sparse_begin"], (232, 8))  # 1.9
        self.assertEqual(o["sparse_end"], (264, 8))
        self.assertEqual(o["request_key_input"], (272, 8))  # 1.10
        self.assertEqual(o["build_meta_update"], (280, 8))
        self.assertEqual(o["handle_info"], (288, 8))
        self.assertEqual(o["store_api"], (296, 8))  # 1.12
        self.assertEqual(ctypes.sizeof(_abi.Api), 304)

    def test_handle_info(self):
        o = offsets(_abi.HandleInfo)
        self.assertEqual(o["chunk_tokens"], (12, 4))
        self.assertEqual(o["save_decode"], (24, 4))
        self.assertEqual(o["lease_timeout_ms"], (32, 8))
        self.assertEqual(ctypes.sizeof(_abi.HandleInfo), 40)
        with _abi.Handle(_abi.ROLE_SCHEDULER, tiny_model()) as h:
            info = h.info()
        self.assertEqual((info["role"], info["save_decode"], info["saves_async"]),
                         (_abi.ROLE_SCHEDULER, 0, 0))
        self.assertGreater(info["chunk_tokens"], 0)

    def test_step_update(self):
        o = offsets(_abi.StepUpdateStruct)
        self.assertEqual(o["req_id"], (8, 8))
        self.assertEqual(o["tokens_from"], (16, 8))
        self.assertEqual(o["blocks_from"], (40, 8))
        self.assertEqual(o["n_scheduled"], (72, 8))
        self.assertEqual(ctypes.sizeof(_abi.StepUpdateStruct), _abi.STEP_UPDATE_SIZE_1_10)


def tiny_model(**kw):
    m = dict(model_id="kvs-py/tiny", dtype=_abi.DTYPE_FP16, n_layers=2, n_kv_heads=2, head_dim=8,
             block_tokens=16, tp_size=1, vocab_size=32000)
    m.update(kw)
    return m


class Calls(unittest.TestCase):
    def test_the_loaded_library_implements_abi_1_5(self):
        api = _abi.get_api()
        self.assertEqual(api.abi_major, 1)
        self.assertGreaterEqual(api.abi_minor, 5)
        self.assertTrue(_abi.has_hook("tier_name"))
        self.assertTrue(_abi.has_hook("load_dropped"))
        self.assertIn("argument", _abi.strerror(_abi.EINVAL).lower())

    def test_a_failed_call_raises_its_status_class_with_the_handle_sentence(self):
        with _abi.Handle(_abi.ROLE_SCHEDULER, tiny_model()) as h:
            with self.assertRaises(_abi.NotFound) as cm:
                h.on_alloc("never-looked-up", [1, 2], 16)
            e = cm.exception
            self.assertEqual(e.status, _abi.ENOTFOUND)
            self.assertEqual(e.hook, "on_alloc")
            self.assertIn("never-looked-up", e.last_error)
            self.assertIsInstance(e, _abi.KvsError)
            with self.assertRaises(_abi.WrongState):  # a worker hook on a scheduler handle
                h.start_load()
            with self.assertRaises(_abi.InvalidArgument):
                h.lookup("x" * 300, [1, 2, 3], 0)

    def test_a_producer_handle_finds_nothing_and_an_unknown_role_is_refused(self):
        with _abi.Handle(_abi.ROLE_SCHEDULER, tiny_model(),
                         transfer_role=_abi.TRANSFER_PRODUCER) as h:
            found = h.lookup("r", list(range(600)), 0)
            self.assertEqual((found.hit_tokens, found.unknown_yet, found.chunk_tokens),
                             (0, False, 256))
        with self.assertRaises(_abi.InvalidArgument) as cm:
            _abi.Handle(_abi.ROLE_SCHEDULER, tiny_model(), transfer_role=3)
        self.assertIn("transfer_role 3", str(cm.exception))

    def test_open_refuses_a_bad_yaml_with_its_line(self):
        d = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, d)
        path = os.path.join(d, "bad.yaml")
        with open(path, "w") as f:
            f.write("version: 1\nchunk_size: 256\ntiers:\n  - {name: d, type: dram, capacity: 1MiB}\n")
        with self.assertRaises(_abi.ConfigError) as cm:
            _abi.Handle(_abi.ROLE_SCHEDULER, tiny_model(), path)
        self.assertIn(f"{path}:2:1", str(cm.exception))
        self.assertIn("chunk_size", cm.exception.last_error)

    def test_a_prompt_saved_and_restored_through_host_pages(self):
        L, H, D, BT, E = 2, 2, 8, 16, 2
        n_blocks, prompt = 40, 300
        token_bytes = H * D * E
        block_bytes = BT * token_bytes
        pages = [(ctypes.c_uint8 * (n_blocks * block_bytes))() for _ in range(2 * L)]
        views = [_abi.LayerView(struct_size=ctypes.sizeof(_abi.LayerView),
                                device_kind=_abi.DEVICE_HOST, n_blocks=n_blocks,
                                k_base=ctypes.addressof(pages[2 * l]),
                                v_base=ctypes.addressof(pages[2 * l + 1]), block_stride=block_bytes,
                                token_stride=token_bytes, head_stride=D * E) for l in range(L)]
        tokens = [(t * 7919 + 13) % 32000 for t in range(prompt)]
        table1 = list(range(0, 19))
        table2 = list(range(20, 39))

        def at(page, table, t):
            return table[t // BT] * block_bytes + t % BT * token_bytes

        with _abi.Handle(_abi.ROLE_BOTH, tiny_model()) as h:
            h.register_kv(views)
            self.assertEqual(h.tier_names(), ["dram"])
            self.assertEqual(h.lookup("r1", tokens, 0).hit_tokens, 0)
            h.on_alloc("r1", table1, 0)
            h.bind_meta(h.build_meta([_abi.StepSpec("r1", tokens, table1, 0, prompt)]))
            h.start_load()
            for l in range(L):
                h.wait_layer_load(l)
                for t in range(prompt):
                    for p in (2 * l, 2 * l + 1):
                        o = at(pages[p], table1, t)
                        for i in range(token_bytes):
                            pages[p][o + i] = (t * 31 + i + p * 7) & 0xFF
                h.save_layer(l)
            h.wait_save()
            self.assertEqual(h.load_error_blocks(), [])
            self.assertEqual(h.get_finished(), ([], []))
            self.assertFalse(h.request_finished("r1"))
            self.assertEqual(h.stats()["chunks_saved"], 1)  # one full chunk of 256 tokens
            found = h.lookup("r2", tokens, 0)
            self.assertEqual(found, _abi.Lookup(256, False, False, 0, 256))
            h.on_alloc("r2", table2, 256)
            h.bind_meta(h.build_meta([_abi.StepSpec("r2", tokens, table2, 256, prompt - 256)]))
            with self.assertRaises(_abi.WrongState):  # before start_load
                h.load_dropped("r2", 0, prompt)
            h.start_load()
            self.assertEqual(h.load_dropped("r2", 0, prompt), [])  # a raw chunk drops nothing
            for l in range(L):
                h.wait_layer_load(l)
                h.save_layer(l)
            h.wait_save()
            self.assertEqual(h.load_error_blocks(), [])
            for p in range(2 * L):
                for t in range(256):
                    a, b = at(pages[p], table1, t), at(pages[p], table2, t)
                    self.assertEqual(bytes(pages[p][a:a + token_bytes]),
                                     bytes(pages[p][b:b + token_bytes]))
            s = h.stats()
            self.assertEqual(s["chunks_loaded"], 1)
            self.assertEqual(s["tier_chunks_loaded"], [1])
            self.assertTrue(any(kind == _abi.EVENT_STORED for kind, _k, _t in h.take_events()))
        self.assertTrue(h.closed)
        h.close()  # idempotent


def host_views(n_layers=2, heads=2, head_dim=8, bt=16, n_blocks=40, elem=2):
    """Host pages (kept alive by the returned list) and their LayerViews, NHD."""
    token_bytes = heads * head_dim * elem
    block_bytes = bt * token_bytes
    pages = [(ctypes.c_uint8 * (n_blocks * block_bytes))() for _ in range(2 * n_layers)]
    views = [_abi.LayerView(struct_size=ctypes.sizeof(_abi.LayerView),
                            device_kind=_abi.DEVICE_HOST, n_blocks=n_blocks,
                            k_base=ctypes.addressof(pages[2 * l]),
                            v_base=ctypes.addressof(pages[2 * l + 1]), block_stride=block_bytes,
                            token_stride=token_bytes, head_stride=head_dim * elem)
             for l in range(n_layers)]
    return pages, views


def worker_step(h, blob, n_layers=2):
    h.bind_meta(blob)
    h.start_load()
    for l in range(n_layers):
        h.wait_layer_load(l)
        h.save_layer(l)
    h.wait_save()


class KeyInputs(unittest.TestCase):
    def test_key_inputs_separate_two_requests_with_the_same_tokens(self):
        tokens = [(t * 7919 + 13) % 32000 for t in range(600)]
        table = list(range(38))
        _pages, views = host_views()
        with _abi.Handle(_abi.ROLE_BOTH, tiny_model()) as h:
            h.register_kv(views)
            h.request_key_input("a", 0, b"tenant-a")
            h.request_key_input("a", 300, b"image-hash")
            self.assertEqual(h.lookup("a", tokens, 0).hit_tokens, 0)
            with self.assertRaises(_abi.WrongState) as e:  # its keys exist now
                h.request_key_input("a", 0, b"late")
            self.assertIn("already has its keys", e.exception.last_error)
            h.on_alloc("a", table, 0)
            worker_step(h, h.build_meta([_abi.StepSpec("a", tokens, table, 0, 600)]))
            h.request_finished("a")
            self.assertEqual(h.stats()["chunks_saved"], 2)
            h.request_key_input("b", 0, b"tenant-b")
            self.assertEqual(h.lookup("b", tokens, 0).hit_tokens, 0)
            h.request_key_input("c", 0, b"tenant-a")
            self.assertEqual(h.lookup("c", tokens, 0).hit_tokens, 256)  # the image is in chunk 1
            h.request_key_input("d", 0, b"tenant-a")
            h.request_key_input("d", 300, b"image-hash")
            self.assertEqual(h.lookup("d", tokens, 0).hit_tokens, 512)
            with self.assertRaises(_abi.InvalidArgument):
                h.request_key_input("e", 0, b"")


class StepUpdates(unittest.TestCase):
    def test_build_meta_update_gives_build_meta_s_blobs_from_deltas(self):
        """Two handles through the same steps: a prefill in two chunks, decode steps of one token
        (one completing a chunk), a rollback of two tokens; the blobs are the same bytes."""
        import array
        cfg = os.path.join(tempfile.mkdtemp(prefix="kvs-py-"), "decode.yaml")
        with open(cfg, "w") as f:
            f.write("chunk_tokens: 256\nsave_decode: true\ntiers:\n  - name: dram\n"
                    "    type: dram\n    capacity: 64MiB\n")
        seq = [(t * 7919 + 13) % 32000 for t in range(600)]
        table = list(range(40))
        bt = 16
        with _abi.Handle(_abi.ROLE_SCHEDULER, tiny_model(), cfg) as full, \
                _abi.Handle(_abi.ROLE_SCHEDULER, tiny_model(), cfg) as delta:
            self.assertEqual(full.lookup("r", seq[:300], 0).hit_tokens, 0)
            self.assertEqual(delta.lookup("r", seq[:300], 0).hit_tokens, 0)
            full.on_alloc("r", table[:19], 0)
            delta.on_alloc("r", table[:19], 0)
            held_t, held_b = 300, 19  # what the library holds after lookup and on_alloc
            steps = [(seq[:300], 0, 200), (seq[:300], 200, 100)]  # (tokens, computed, scheduled)
            n = 300
            for _ in range(220):  # decode: the step to 512 tokens completes chunk 1
                steps.append((seq[:n + 1], n, 1))
                n += 1
            # two tokens rolled back, one other in their place
            steps.append((seq[:n - 2] + [4242], n - 2, 1))
            blobs = 0
            saves = 0
            for cur, n_computed, n_scheduled in steps:
                n_tokens = len(cur)
                nb = (n_tokens + bt - 1) // bt
                a = full.build_meta([_abi.StepSpec("r", cur, table[:nb], n_computed, n_scheduled)])
                tf = n_computed if n_tokens <= held_t else held_t  # the tokens still the same
                bf = min(held_b, nb)
                b = delta.build_meta_update([_abi.StepUpdate(
                    "r", tf, array.array("i", cur[tf:]), bf, array.array("I", table[bf:nb]),
                    n_computed, n_scheduled)])
                saves += len(b) > 64  # a blob with a request in it
                self.assertEqual(a, b)
                blobs += 1
                held_t, held_b = n_tokens, nb
            self.assertEqual(blobs, len(steps))
            self.assertEqual(saves, 2)  # the prefill's chunk 0 and the decode's chunk 1
            with self.assertRaises(_abi.InvalidArgument) as e:
                delta.build_meta_update([_abi.StepUpdate("r", held_t + 1, [], held_b, [], 0, 0)])
            self.assertIn("tokens_from", e.exception.last_error)


def run_python(code, env_updates, unset=()):
    env = dict(os.environ)
    for k in unset:
        env.pop(k, None)
    env.update(env_updates)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=120)


class LibraryLookup(unittest.TestCase):
    def test_kvstrata_library_that_cannot_be_loaded_is_named(self):
        r = run_python("import kvstrata._abi as a\ntry:\n a.get_api()\nexcept a.LibraryNotFound as e:"
                       "\n print(e)", {"KVSTRATA_LIBRARY": "/nonexistent/libkvstrata.so"})
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("KVSTRATA_LIBRARY=/nonexistent/libkvstrata.so cannot be loaded", r.stdout)

    def test_the_package_folder_then_the_system_loader(self):
        lib = os.environ["KVSTRATA_LIBRARY"]
        d = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, d)
        pkg = os.path.join(d, "kvstrata")
        shutil.copytree(PACKAGE, pkg, ignore=shutil.ignore_patterns("__pycache__", "*.so*"))
        code = ("import kvstrata._abi as a\ntry:\n a.get_api(); print('loaded', a.library_path())\n"
                "except a.LibraryNotFound as e:\n print(e)")
        r = run_python(code, {"PYTHONPATH": d, "LD_LIBRARY_PATH": ""}, unset=["KVSTRATA_LIBRARY"])
        self.assertEqual(r.returncode, 0, r.stderr)
        if r.stdout.startswith("loaded"):  # a libkvstrata installed on this machine
            self.assertNotIn(pkg, r.stdout)
        else:
            self.assertIn("KVSTRATA_LIBRARY is not set", r.stdout)
            self.assertIn(f"the package folder {pkg} holds no libkvstrata.so", r.stdout)
            self.assertIn("the system loader finds no libkvstrata.so.1", r.stdout)
        shutil.copy(lib, os.path.join(pkg, "libkvstrata.so"))
        r = run_python(code, {"PYTHONPATH": d}, unset=["KVSTRATA_LIBRARY"])
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.strip(), f"loaded {os.path.join(pkg, 'libkvstrata.so')}")


if __name__ == "__main__":
    unittest.main()
