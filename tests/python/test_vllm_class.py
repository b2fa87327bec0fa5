"""KvstrataConnector as a class: the signatures vLLM's base class lists, no library loaded by import or
class methods, the model description, views built from strides, stats and Prometheus metrics."""

import ctypes
import inspect
import os
import subprocess
import sys
import unittest

import torch

from kvstrata import _abi, _vllm_standin as standin
from kvstrata import vllm as kv
from kvs_harness import (KVCacheConfig, KVCacheGroupSpec, FullAttentionSpec, KVCacheTensor,
                         CachedRequestData, SchedulerOutput, make_kv_cache_config,
                         make_vllm_config)

STANDIN = os.path.join(os.path.dirname(standin.__file__), "_vllm_standin.py")

# The hooks a vLLM connector must override beyond the abstract ones.
REQUIRED = ("register_kv_caches", "register_cross_layers_kv_cache", "get_num_new_matched_tokens",
            "update_state_after_alloc", "build_connector_meta", "bind_connector_metadata",
            "clear_connector_metadata", "start_load_kv", "wait_for_layer_load", "save_kv_layer",
            "wait_for_save", "get_finished", "get_block_ids_with_load_errors", "handle_preemptions",
            "request_finished", "request_finished_all_groups", "take_events",
            "get_kv_connector_stats", "build_kv_connector_stats", "build_prom_metrics",
            "requires_kv_delivery", "requires_piecewise_for_cudagraph", "shutdown")


def shape_of(fn):
    """(name, kind, has default) of every parameter."""
    return [(p.name, p.kind, p.default is not inspect.Parameter.empty)
            for p in inspect.signature(fn).parameters.values()]


class Signatures(unittest.TestCase):
    def compare(self, base_classes):
        cls = kv.KvstrataConnector
        for name, member in vars(cls).items():
            if name.startswith("_") and name != "__init__":
                continue
            base = next((b for b in base_classes if name in vars(b) or hasattr(b, name)), None)
            self.assertIsNotNone(base, f"{name} is not a hook of vLLM's connector base classes")
            theirs = inspect.getattr_static(base, name)
            if isinstance(member, property):
                self.assertIsInstance(theirs, property, name)
                continue
            self.assertEqual(isinstance(member, classmethod), isinstance(theirs, classmethod), name)
            mine, ref = shape_of(getattr(cls, name)), shape_of(getattr(base, name))
            self.assertEqual([p[:2] for p in mine], [p[:2] for p in ref], name)
            for m, r in zip(mine, ref):
                if r[2]:
                    self.assertTrue(m[2], f"{name}: {m[0]} needs a default as vLLM's has")

    def test_every_method_has_the_signature_of_the_stand_in(self):
        self.compare([standin.KVConnectorBase_V1, standin.SupportsHMA])

    @unittest.skipUnless(kv.HAVE_VLLM, "vLLM is not installed here (the stand-in is compared)")
    def test_every_method_has_the_signature_of_vllm(self):
        self.compare([kv.KVConnectorBase_V1, kv.SupportsHMA])

    def test_the_class_is_complete(self):
        self.assertEqual(kv.KvstrataConnector.__abstractmethods__, frozenset())
        for name in REQUIRED:  # defined by kvstrata's classes, not inherited from vLLM's base
            owner = next(c for c in kv.KvstrataConnector.__mro__ if name in vars(c))
            self.assertIn(owner.__module__, ("kvstrata.vllm", "kvstrata.vllm_worker"), name)

    def test_hybrid_support_is_declared(self):
        # kvstrata stores every full-attention and sliding-window KV cache group (a handle each),
        # so vLLM keeps its hybrid allocator on for such models (test_replay_hybrid drives it).
        self.assertTrue(standin.supports_hma(kv.KvstrataConnector))
        self.assertTrue(issubclass(kv.KvstrataConnector, kv.SupportsHMA))
        self.assertIn("request_finished_all_groups", vars(kv.KvstrataConnector))

    def test_the_stand_in_has_mains_metric_helpers(self):
        # main (017e9f4448b7) moved make_per_engine out of KVConnectorPromMetrics into
        # vllm.v1.metrics.utils.create_metric_per_engine; a stand-in that kept it would hide a
        # connector that still calls it (vllm serve crashed at start).
        self.assertFalse(hasattr(standin.KVConnectorPromMetrics, "make_per_engine"))
        self.assertTrue(callable(standin.create_metric_per_engine))
        self.assertFalse(hasattr(standin.KVConnectorBase_V1, "set_eagle_prefix_cache_hashing"))
        self.assertIsInstance(inspect.getattr_static(standin.KVConnectorBase_V1,
                                                     "supports_divergent_local_hybrid_hits"),
                              property)

    def test_the_stand_in_says_what_it_is_on_its_first_line(self):
        with open(STANDIN) as f:
            first = f.readline()
        self.assertTrue(first.startswith("# Names and signatures only"), first)

    def test_the_stand_in_is_used_only_without_vllm(self):
        self.assertEqual(kv.KVConnectorBase_V1 is standin.KVConnectorBase_V1, not kv.HAVE_VLLM)

    def test_class_answers(self):
        C = kv.KvstrataConnector
        self.assertTrue(C.requires_piecewise_for_cudagraph({}))
        self.assertIsNone(C.get_required_kvcache_layout(None))
        s = C.build_kv_connector_stats({"lookups": 2})
        self.assertIsInstance(s, kv.KvstrataConnectorStats)
        self.assertEqual(s.data, {"lookups": 2})
        self.assertTrue(C.build_kv_connector_stats().is_empty())


LAZY = r"""
import sys
import kvstrata.vllm as kv, kvstrata._abi as abi
C = kv.KvstrataConnector
C.build_kv_connector_stats({"lookups": 1}).reduce()
C.build_kv_connector_stats()
C.requires_piecewise_for_cudagraph({})
C.get_required_kvcache_layout(None)
class Metric:
    def __init__(self, **kw): pass
    def labels(self, *v): return self
    def inc(self, v=1): pass
    def set(self, v): pass
keys = {}
if kv.HAVE_VLLM:
    import prometheus_client as p
    keys = {p.Gauge: Metric, p.Counter: Metric, p.Histogram: Metric}
else:
    keys = {type("Gauge", (), {}): Metric, type("Counter", (), {}): Metric,
            type("Histogram", (), {}): Metric}
class Cfg:
    kv_transfer_config = None
m = C.build_prom_metrics(Cfg(), keys, ["model_name", "engine"], {0: ["m", "0"]})
m.observe({"lookup_hit_tokens": 5, "tiers": {"dram": {"bytes_loaded": 10, "load_ns": 5}}}, 0)
maps = open("/proc/self/maps").read()
print("loaded" if abi.library_loaded() or "libkvstrata" in maps else "not loaded",
      "torch" if "torch" in sys.modules else "no torch")
"""


class Construction(unittest.TestCase):
    def test_a_type_error_of_the_base_class_is_not_retried_with_two_arguments(self):
        # Only a base class whose __init__ has no kv_cache_config parameter (older releases) gets
        # two arguments; any other TypeError reaches the caller as it was raised.
        calls = []

        def failing_init(self, vllm_config, role, kv_cache_config):
            calls.append(3)
            raise TypeError("kv_cache_config has no kv_cache_groups")

        base = kv.KVConnectorBase_V1
        saved = base.__init__
        base.__init__ = failing_init
        try:
            with self.assertRaisesRegex(TypeError, "has no kv_cache_groups"):
                kv.KvstrataConnector(object(), kv.KVConnectorRole.SCHEDULER, object())
        finally:
            base.__init__ = saved
        self.assertEqual(calls, [3])

    def test_an_older_two_argument_base_gets_two_arguments(self):
        got = []

        def old_init(self, vllm_config, role):
            got.append((vllm_config, role))
            raise RuntimeError("stop here")

        base = kv.KVConnectorBase_V1
        saved = base.__init__
        base.__init__ = old_init
        try:
            with self.assertRaisesRegex(RuntimeError, "stop here"):
                kv.KvstrataConnector("cfg", "role", "kcc")
        finally:
            base.__init__ = saved
        self.assertEqual(got, [("cfg", "role")])


class Registration(unittest.TestCase):
    def registered(self, kv_caches, group_names):
        c = object.__new__(kv.KvstrataConnector)
        c._kv_cache_config = (KVCacheConfig(num_blocks=4, kv_cache_tensors=[], kv_cache_groups=[
            KVCacheGroupSpec(group_names, FullAttentionSpec(16, 4, 8))]) if group_names else None)
        c._shared_layers = set()
        got = {}
        c._register = lambda layers, index: got.update(layers=[n for n, _ in layers], index=index)
        c.register_kv_caches(kv_caches)
        return got["layers"], got["index"], c._shared_layers

    def test_a_layer_in_no_group_with_a_grouped_layers_tensor_shares_its_kv(self):
        a, b = torch.empty((2, 4, 16, 4, 8)), torch.empty((2, 4, 16, 4, 8))
        layers, index, shared = self.registered({"l0": a, "l1": b, "l2": a}, ["l0", "l1"])
        self.assertEqual((layers, index, shared), (["l0", "l1"], {"l0": 0, "l1": 1, "l2": 0},
                                                   {"l2"}))

    def test_grouped_layers_whose_tensors_alias_stay_layers_of_their_own(self):
        # vLLM's hybrid allocator backs layers of different groups with one buffer: their views
        # can have the same address and shape, and they are still different layers.
        a = torch.empty((2, 4, 16, 4, 8))
        layers, index, shared = self.registered({"l0": a, "l1": a.view(a.shape)}, ["l0", "l1"])
        self.assertEqual((layers, shared), (["l0", "l1"], set()))

    def test_a_layer_in_no_group_and_with_a_tensor_of_its_own_is_refused(self):
        a, b = torch.empty((2, 4, 16, 4, 8)), torch.empty((2, 4, 16, 4, 8))
        with self.assertRaisesRegex(kv.KvstrataConfigError, "'l9' is in no KV cache group"):
            self.registered({"l0": a, "l9": b}, ["l0"])


class LazyLoading(unittest.TestCase):
    def test_import_and_class_methods_load_no_library(self):
        env = dict(os.environ, KVSTRATA_LIBRARY="/nonexistent/libkvstrata.so")
        r = subprocess.run([sys.executable, "-c", LAZY], env=env, capture_output=True, text=True,
                           timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.split(), ["not", "loaded", "no", "torch"])


class FakeHandle:
    def __init__(self, answer):
        self.answer = answer
        self.calls = []

    def lookup(self, req_id, tokens, n_computed):
        self.calls.append((req_id, list(tokens), n_computed))
        return self.answer


class Req:
    def __init__(self, rid, tokens):
        self.request_id = rid
        self.all_token_ids = tokens
        self.lora_request = None
        self.mm_features = []
        self.prompt_embeds = None
        self.cache_salt = None


def bare_connector(handle):
    c = object.__new__(kv.KvstrataConnector)
    c._requests = {}
    c._handle = handle
    c._epoch = None
    c._tenants = {}
    c._tenant_labels = set()
    c._key_inputs_supported = False
    return c


class LookupAnswers(unittest.TestCase):
    def test_unknown_yet_is_none(self):
        c = bare_connector(FakeHandle(_abi.Lookup(0, True, False)))
        self.assertEqual(c.get_num_new_matched_tokens(Req("r", [1, 2, 3]), 0), (None, False))

    def test_load_async_only_with_tokens(self):
        c = bare_connector(FakeHandle(_abi.Lookup(32, False, True)))
        self.assertEqual(c.get_num_new_matched_tokens(Req("r", list(range(40))), 0), (32, True))
        c = bare_connector(FakeHandle(_abi.Lookup(0, False, True)))
        self.assertEqual(c.get_num_new_matched_tokens(Req("s", list(range(40))), 0), (0, False))

    def test_tokens_are_passed_whole_and_kept_between_calls(self):
        h = FakeHandle(_abi.Lookup(0, False, False))
        c = bare_connector(h)
        r = Req("r", list(range(10)))
        c.get_num_new_matched_tokens(r, 0)
        r.all_token_ids = list(range(12))
        c.get_num_new_matched_tokens(r, 4)
        self.assertEqual(h.calls, [("r", list(range(10)), 0), ("r", list(range(12)), 4)])


class UpdateHandle:
    """A scheduler handle that records the updates each build_meta_update hands over."""

    def __init__(self):
        self.steps = []

    def build_meta_update(self, updates):
        self.steps.append({u.req_id: u for u in updates})
        return b""


def update_connector():
    c = bare_connector(None)
    h = UpdateHandle()
    c._handles = [h]
    c._groups, c._windows = [], []
    c._watch = set()
    c._meta_updates = True
    c._decode_saves = False
    c._kept_groups = {}
    return c, h


def cached(rows, resumed=(), all_tokens=None):
    """rows: (req_id, new block ids or None, num_computed_tokens) for each cached request."""
    return SchedulerOutput([], CachedRequestData([r[0] for r in rows], set(resumed), [],
                                                 all_tokens or {}, [r[1] for r in rows],
                                                 [r[2] for r in rows], [0] * len(rows)),
                           {r[0]: 1 for r in rows}, len(rows), {}, {}, [], set(), [])


class StepUpdates(unittest.TestCase):
    """Which cached requests a step hands over (build_meta_update), decided without visiting the
    parked ones."""

    def parked(self, c, rid, prompt_len):
        st = c._requests[rid] = kv._SchedRequest(Req(rid, list(range(prompt_len + 5))), None, 1)
        st.prompt_tokens, st.skip_from, st.parked = prompt_len, prompt_len, True
        st.tables = [[1, 2, 3, 4, 5]]
        return st

    def test_positions_are_those_of_watched_resumed_and_whole_token_requests_in_order(self):
        ids = [f"r{i}" for i in range(40)]
        pos = kv.KvstrataConnector._positions
        self.assertEqual(pos(ids, set(), set(), {}), ())
        self.assertEqual(pos(ids, {"r30", "gone"}, {"r2"}, {"r17": [1]}), [2, 17, 30])
        self.assertEqual(pos(ids[:3], {"r0", "r1", "r2", "x"}, set(), {}), [0, 1, 2])

    def test_parked_requests_are_not_handed_over_and_resumed_ones_are_whole(self):
        c, h = update_connector()
        a = self.parked(c, "A", 70)
        self.parked(c, "B", 70)
        c.build_connector_meta(cached([("A", ([9],), 80), ("B", None, 75)]))
        self.assertEqual(h.steps[-1], {})
        self.assertEqual(a.tables, [[1, 2, 3, 4, 5]], "a parked request's table is not followed")
        c.build_connector_meta(cached([("A", ([7, 8, 9, 10, 11, 12],), 0)], resumed={"A"}))
        u = h.steps[-1]["A"]
        self.assertEqual((u.blocks_from, list(u.block_ids)), (0, [7, 8, 9, 10, 11, 12]))
        self.assertFalse(a.parked)
        self.assertEqual(c._watch, {"A"})

    def test_a_parked_request_back_in_its_prompt_without_its_table_bypasses(self):
        c, h = update_connector()
        a = self.parked(c, "A", 70)
        with self.assertLogs("kvstrata", "WARNING") as logs:
            c.build_connector_meta(cached([("A", None, 16)], all_tokens={"A": list(range(75))}))
        self.assertIn("bypasses the connector", "\n".join(logs.output))
        self.assertEqual(h.steps[-1], {})
        self.assertTrue(a.bypass)


class StatsHandle:
    """A handle whose counters the test sets."""

    def __init__(self):
        self.s = _abi.Stats(struct_size=ctypes.sizeof(_abi.Stats))

    def stats_struct(self):
        out = _abi.Stats()
        ctypes.memmove(ctypes.byref(out), ctypes.byref(self.s), ctypes.sizeof(out))
        return out


class StatsPerStep(unittest.TestCase):
    """vLLM's scheduler asks get_kv_connector_stats every step: unchanged counters answer None
    without building a delta, and a changed counter or a tenant's count is still reported."""

    def test_only_what_changed_is_reported(self):
        c = bare_connector(None)
        h = StatsHandle()
        c._handle, c._handles = h, [h]
        c._last_stats = c._last_raw_stats = None
        c._tier_names, c._scheduler = ["dram"], True
        h.s.lookups = 3
        self.assertEqual(c.get_kv_connector_stats().data.get("lookups"), 3)
        self.assertIsNone(c.get_kv_connector_stats(), "nothing changed")
        c._tenants = {"t1": {"lookups": 1}}
        self.assertEqual(c.get_kv_connector_stats().data.get("tenants"), {"t1": {"lookups": 1}})
        self.assertIsNone(c.get_kv_connector_stats())
        h.s.lookups = 5
        self.assertEqual(c.get_kv_connector_stats().data.get("lookups"), 2, "the delta")


def spec(**kw):
    s = dict(layout="nhd", dtype="fp16", tp=2, n_layers=3, heads_total=8, head_dim=64,
             block_size=16, kernel_block_size=None, n_blocks=10, chunk_tokens=256, vocab=1000,
             token_budget=1, mla=False, model_id="org/model", engine_id="e1",
             model_dtype="bfloat16", cache_dtype="auto", extra_config={})
    s.update(kw)
    return s


class ModelDescriptions(unittest.TestCase):
    def test_the_scheduler_and_every_worker_agree_but_on_the_rank(self):
        s = spec()
        sched = kv.describe_model(make_vllm_config(s), make_kv_cache_config(s), scheduler=True)
        for rank in (0, 1):
            w = kv.describe_model(make_vllm_config(s, rank), make_kv_cache_config(s),
                                  scheduler=False)
            self.assertEqual(w.tp_rank, rank)
            a, b = sched.as_dict(), w.as_dict()
            a.pop("tp_rank"), b.pop("tp_rank")
            self.assertEqual(a, b)
        self.assertEqual((sched.n_layers, sched.n_kv_heads, sched.head_dim, sched.block_tokens),
                         (3, 4, 64, 16))
        self.assertEqual((sched.dtype, sched.tp_size, sched.vocab_size),
                         (_abi.DTYPE_BF16, 2, 1000))

    def test_without_a_kv_cache_config_the_model_config_says(self):
        s = spec()
        d = kv.describe_model(make_vllm_config(s), None)
        self.assertEqual((d.n_layers, d.n_kv_heads, d.head_dim, d.block_tokens), (3, 4, 64, 16))

    def test_fp8_caches_and_mla(self):
        s = spec(cache_dtype="fp8", mla=True, heads_total=1, head_dim=576)
        d = kv.describe_model(make_vllm_config(s, 1), make_kv_cache_config(s), scheduler=False)
        self.assertEqual((d.dtype, d.is_mla, d.n_kv_heads, d.tp_rank),
                         (_abi.DTYPE_FP8_E4M3, True, 1, 0))

    def test_refusals(self):
        s = spec(cache_dtype="int4")
        with self.assertRaisesRegex(kv.KvstrataConfigError, "'int4'"):
            kv.describe_model(make_vllm_config(s), None)
        s = spec()
        kcc = make_kv_cache_config(s)
        kcc.kv_cache_groups.append(KVCacheGroupSpec(["x"], FullAttentionSpec(16, 4, 64)))
        # two groups: a description each, their salts apart (their chunks have keys of their own)
        d0 = kv.describe_model(make_vllm_config(s), kcc, group=0)
        d1 = kv.describe_model(make_vllm_config(s), kcc, group=1)
        self.assertEqual(d1.n_layers, 1)
        self.assertNotEqual(d0.salt, d1.salt)
        kcc.kv_cache_groups.append(KVCacheGroupSpec(["m1"], type("MambaSpec", (), {})()))
        with self.assertRaisesRegex(kv.KvstrataConfigError, "MambaSpec state"):
            kv.describe_model(make_vllm_config(s), kcc, group=0)
        kcc.kv_cache_groups[2] = KVCacheGroupSpec(["c1"], type("ChunkedLocalAttentionSpec", (), {
            "num_kv_heads": 4, "block_size": 16})())
        with self.assertRaisesRegex(kv.KvstrataConfigError, "ChunkedLocalAttentionSpec"):
            kv.describe_model(make_vllm_config(s), kcc, group=0)
        kcc = make_kv_cache_config(s)
        MambaSpec = type("MambaSpec", (), {"block_size": 16})
        kcc.kv_cache_groups[0] = KVCacheGroupSpec(["m0"], MambaSpec())
        with self.assertRaisesRegex(kv.KvstrataConfigError, "MambaSpec state"):
            kv.describe_model(make_vllm_config(s), kcc)
        cfg = make_vllm_config(s)
        cfg.parallel_config.pipeline_parallel_size = 2
        with self.assertRaisesRegex(kv.KvstrataConfigError, "pipeline parallelism"):
            kv.describe_model(cfg, None)

    def test_the_default_yaml_names_the_engine_and_fits_the_block_size(self):
        s = spec(engine_id="abc/def 1", extra_config={"dram_capacity": "512MiB"})
        cfg = make_vllm_config(s)
        text = kv.default_config_text(cfg, s["extra_config"], 48)
        self.assertIn("shm_name: kvstrata-abc_def_1\n", text)
        self.assertIn("capacity: 512MiB\n", text)
        self.assertIn("chunk_tokens: 240\n", text)
        with self.assertRaisesRegex(kv.KvstrataConfigError, "dram_capacity"):
            kv.default_config_text(cfg, {"dram_capacity": "4GiB\nx: 1"}, 16)
        cfg.kv_transfer_config.engine_id = ""
        with self.assertRaisesRegex(kv.KvstrataConfigError, "engine_id"):
            kv.default_config_text(cfg, {}, 16)


def desc(**kw):
    d = dict(model_id="m", dtype=_abi.DTYPE_FP16, n_layers=1, n_kv_heads=4, head_dim=8,
             block_tokens=16, is_mla=False, tp_rank=0, tp_size=1, salt=None, vocab_size=0)
    d.update(kw)
    return kv.ModelDescription(**d)


class Views(unittest.TestCase):
    def check(self, t, d, k_off, v_off, n_blocks, block, token, head):
        v = kv.layer_view("l0", t, d)
        e = t.element_size()
        self.assertEqual(v.k_base, t.data_ptr() + k_off * e)
        self.assertEqual(v.v_base or None, None if v_off is None else t.data_ptr() + v_off * e)
        self.assertEqual((v.n_blocks, v.block_stride, v.token_stride, v.head_stride),
                         (n_blocks, block * e, token * e, head * e))
        self.assertEqual(v.device_kind, _abi.DEVICE_HOST)

    def test_flash_attention_nhd_and_hnd(self):
        t = torch.empty((2, 5, 16, 4, 8), dtype=torch.float16)
        self.check(t, desc(), 0, 5 * 16 * 32, 5, 16 * 32, 32, 8)
        t = torch.empty((2, 5, 4, 16, 8), dtype=torch.float16).permute(0, 1, 3, 2, 4)
        self.check(t, desc(), 0, 5 * 16 * 32, 5, 16 * 32, 8, 16 * 8)

    def test_flashinfer_mla_packed(self):
        t = torch.empty((5, 2, 16, 4, 8), dtype=torch.bfloat16)
        self.check(t, desc(dtype=_abi.DTYPE_BF16), 0, 16 * 32, 5, 2 * 16 * 32, 32, 8)
        t = torch.empty((5, 16, 576), dtype=torch.uint8)
        self.check(t, desc(dtype=_abi.DTYPE_FP8_E4M3, is_mla=True, n_kv_heads=1, head_dim=576),
                   0, None, 5, 16 * 576, 576, 576)
        t = torch.empty((5, 4, 16, 16), dtype=torch.float16)
        self.check(t, desc(), 0, 8, 5, 4 * 16 * 16, 16, 16 * 16)

    def test_kernel_blocks_inside_a_scheduler_block(self):
        t = torch.empty((2, 10, 16, 4, 8), dtype=torch.float16)
        self.check(t, desc(block_tokens=32), 0, 10 * 16 * 32, 5, 2 * 16 * 32, 32, 8)
        t = torch.empty((2, 10, 4, 16, 8), dtype=torch.float16).permute(0, 1, 3, 2, 4)
        with self.assertRaisesRegex(kv.KvstrataConfigError, "HND"):
            kv.layer_view("l0", t, desc(block_tokens=32))

    def test_refusals_name_the_layer_and_the_reason(self):
        t = torch.empty((2, 5, 16, 4, 8), dtype=torch.float16)
        with self.assertRaisesRegex(kv.KvstrataConfigError, r"'l0'.*2 KV heads"):
            kv.layer_view("l0", t, desc(n_kv_heads=2))
        with self.assertRaisesRegex(kv.KvstrataConfigError, "dtype float16 disagrees"):
            kv.layer_view("l0", t, desc(dtype=_abi.DTYPE_BF16))
        with self.assertRaisesRegex(kv.KvstrataConfigError, "not contiguous"):
            kv.layer_view("l0", torch.empty((2, 5, 16, 8, 4), dtype=torch.float16).transpose(3, 4),
                          desc())
        with self.assertRaisesRegex(kv.KvstrataConfigError, "do not divide"):
            kv.layer_view("l0", t, desc(block_tokens=24))


class Metric:
    log = []

    def __init__(self, name, documentation, labelnames):
        self.name, self.labelnames = name, labelnames

    def labels(self, *values):
        return Child(self.name, values)


class Child:
    def __init__(self, name, values):
        self.name, self.values = name, values

    def inc(self, v=1):
        Metric.log.append(("inc", self.name, self.values, v))

    def set(self, v):
        Metric.log.append(("set", self.name, self.values, v))


class StatsAndMetrics(unittest.TestCase):
    def test_stats_aggregate_and_reduce(self):
        a = kv.KvstrataConnectorStats(data={"bytes_loaded": 3_000_000_000, "load_ns": 1_000_000_000,
                                            "tiers": {"dram": {"bytes_loaded": 3_000_000_000,
                                                               "load_ns": 1_000_000_000}}})
        b = kv.KvstrataConnectorStats(data={"load_errors": 1, "tiers": {
            "dram": {"bytes_loaded": 1_000_000_000, "load_ns": 1_000_000_000},
            "nvme": {"bytes_loaded": 500_000_000, "load_ns": 1_000_000_000}}})
        r = a.aggregate(b).reduce()
        self.assertEqual(r["load_errors"], 1)
        self.assertEqual(r["load_gbps"], 3.0)
        self.assertEqual(r["load_gbps[dram]"], 2.0)
        self.assertEqual(r["load_gbps[nvme]"], 0.5)
        self.assertFalse(a.is_empty())
        a.reset()
        self.assertTrue(a.is_empty())

    def test_prometheus_counters_per_engine_and_tier(self):
        types = {type("Gauge", (), {}): Metric, type("Counter", (), {}): Metric,
                 type("Histogram", (), {}): Metric}
        if kv.HAVE_VLLM:
            import prometheus_client as p

            types = {p.Gauge: Metric, p.Counter: Metric, p.Histogram: Metric}

        class Cfg:
            kv_transfer_config = None

        m = kv.KvstrataConnector.build_prom_metrics(Cfg(), types, ["model_name", "engine"],
                                                    {0: ["m", "0"], 1: ["m", "1"]})
        Metric.log.clear()
        m.observe({"lookup_hit_tokens": 96, "load_errors": 1, "tiers": {
            "dram": {"bytes_loaded": 2_000_000_000, "load_ns": 1_000_000_000, "chunks_loaded": 3}}},
                  1)
        log = set(Metric.log)
        self.assertIn(("inc", "vllm:kvstrata_hit_tokens", ("m", "1"), 96), log)
        self.assertIn(("inc", "vllm:kvstrata_load_errors", ("m", "1"), 1), log)
        self.assertIn(("inc", "vllm:kvstrata_loaded_bytes", ("m", "1", "dram"), 2_000_000_000), log)
        self.assertIn(("inc", "vllm:kvstrata_load_seconds", ("m", "1", "dram"), 1.0), log)
        self.assertIn(("inc", "vllm:kvstrata_loaded_chunks", ("m", "1", "dram"), 3), log)
        self.assertIn(("set", "vllm:kvstrata_load_gbps", ("m", "1", "dram"), 2.0), log)
        self.assertEqual(len(log), 6, log)
        Metric.log.clear()
        m.observe({"tenants": {"3f2a": {"lookups": 2, "hit_tokens": 64, "miss_tokens": 10}}}, 0)
        self.assertEqual(set(Metric.log), {
            ("inc", "vllm:kvstrata_tenant_lookups", ("m", "0", "3f2a"), 2),
            ("inc", "vllm:kvstrata_tenant_hit_tokens", ("m", "0", "3f2a"), 64),
            ("inc", "vllm:kvstrata_tenant_miss_tokens", ("m", "0", "3f2a"), 10)})
        s = kv.KvstrataConnectorStats(data={"tenants": {"3f2a": {"lookups": 1, "hit_tokens": 32}}})
        s.aggregate(kv.KvstrataConnectorStats(data={"tenants": {"3f2a": {"lookups": 1}}}))
        self.assertEqual(s.data["tenants"]["3f2a"], {"lookups": 2, "hit_tokens": 32})
        self.assertEqual(s.reduce()["hit_tokens[tenant=3f2a]"], 32)


if __name__ == "__main__":
    unittest.main()
