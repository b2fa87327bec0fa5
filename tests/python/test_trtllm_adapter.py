"""kvstrata.trtllm driven in TensorRT-LLM's call order (connectors/kv_cache_connector.py's manager
and py_executor.py, read at upstream commit 035ab91cad04) against the stand-ins, with a torch CPU
pool on the host device: saves and byte-exact restores, deltas over several iterations, -1 blocks,
a load the runtime takes in part or not at all, a request reset, get_finished, and the scheduler and
the worker in separate processes with the metadata passed as bytes."""

import inspect
import json
import os
import re
import shutil
import tempfile
import types
import unittest
import uuid

import torch

from kvstrata import _abi, _trtllm_standin as standin
from kvstrata import trtllm as kt
from kvs_harness import Actor

LAYERS, HEADS, HEAD_DIM, TPB = 2, 2, 8, 4  # tokens per block
CHUNK = 4
N_BLOCKS = 48
SENTINEL = -7.0


def make_model_dir(tmp):
    d = os.path.join(tmp, "model")
    os.mkdir(d)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump({"num_hidden_layers": LAYERS, "num_attention_heads": 4,
                   "num_key_value_heads": HEADS, "head_dim": HEAD_DIM, "hidden_size": 32,
                   "torch_dtype": "float16", "vocab_size": 1000}, f)
    return d


def llm_args(model_dir):
    return types.SimpleNamespace(
        model=model_dir, tensor_parallel_size=1, pipeline_parallel_size=1,
        kv_cache_config=types.SimpleNamespace(tokens_per_block=TPB, dtype="auto"))


def write_config(tmp, loads_async=False, saves_async=False, chunk=CHUNK):
    path = os.path.join(tmp, "kvstrata.yaml")
    text = f"version: 1\nchunk_tokens: {chunk}\n"
    if loads_async:
        text += "loads:\n  async: always\n"
    if saves_async:
        text += "saves:\n  async: true\n"
    text += ("tiers:\n  - name: dram\n    type: dram\n    capacity: 64MiB\n    options:\n"
             f"      shm_name: kvs-trt-{uuid.uuid4().hex[:12]}\n")
    with open(path, "w") as f:
        f.write(text)
    return path


def kv_value(tokens, pos, layer, kv):
    """What "the model" computes for position pos: a function of the prefix up to pos (small
    integers, exact in fp16), one value per (head, dim)."""
    h = 0
    for t in tokens[:pos + 1]:
        h = (h * 131 + t + 7) % 1009
    base = (h + 37 * layer + 101 * kv) % 997
    return torch.arange(HEADS * HEAD_DIM, dtype=torch.float32).reshape(HEADS, HEAD_DIM) + base


class WorkerSide:
    """A TensorRT-LLM rank's worker half: the primary pool ([blocks, layers, 2, heads * tokens *
    head_dim], HND inside a block), the connector worker, and a forward pass that writes each
    scheduled token's KV between the layer's pre and post hooks. Lives in the test's process or,
    through Actor, in its own."""

    def __init__(self, model_dir, config):
        os.environ["KVSTRATA_CONFIG"] = config
        self.pool = torch.full((N_BLOCKS, LAYERS, 2, HEADS * TPB * HEAD_DIM), SENTINEL,
                               dtype=torch.float16)
        self.worker = kt.KvstrataTrtllmWorker(llm_args(model_dir))
        # the executor's _maybe_init_kv_connector_manager: the pool, then the layer hooks
        self.worker.register_kv_caches(self.pool)
        self.after_load = {}

    def _write(self, layer, block, slot, values):
        k = self.pool[block, layer, 0].view(HEADS, TPB, HEAD_DIM)
        k[:, slot, :] = values[0].to(torch.float16)
        v = self.pool[block, layer, 1].view(HEADS, TPB, HEAD_DIM)
        v[:, slot, :] = values[1].to(torch.float16)

    def step(self, meta, work):
        """One iteration from handle_metadata on: bind, start_load_kv, the decoder layers with their
        hooks, wait_for_save. work: [(tokens, table, first, end)] positions each request computes.
        Records the pool as each layer saw it after its load (after_load)."""
        if meta is not None:
            self.worker.bind_connector_meta(meta)
        self.worker.start_load_kv(None)
        for layer in range(LAYERS):
            self.worker.wait_for_layer_load(layer, None)
            self.after_load[layer] = self.pool[:, layer].clone()
            for tokens, table, first, end in work:
                for p in range(first, end):
                    block = table[p // TPB]
                    if block < 0:
                        continue  # a sliding window's block the engine holds no page for
                    self._write(layer, block, p % TPB,
                                (kv_value(tokens, p, layer, 0), kv_value(tokens, p, layer, 1)))
            self.worker.save_kv_layer(layer, None)
        self.worker.wait_for_save(None)

    def blocks(self, ids):
        return self.pool[list(ids)].clone()

    def loaded_view(self, ids):
        return torch.stack([self.after_load[layer][list(ids)] for layer in range(LAYERS)], dim=1)

    def get_finished(self, saving, loading):
        return self.worker.get_finished(list(saving), list(loading))

    def stats(self):
        return self.worker._handle.stats()

    def shutdown(self):
        self.worker.shutdown()


class Local:
    """WorkerSide in this process with Actor's call()."""

    def __init__(self, *args):
        self.obj = WorkerSide(*args)

    def call(self, name, *a):
        return getattr(self.obj, name)(*a)

    def close(self):
        self.obj.shutdown()


class Request:
    """The LlmRequest fields the connector reads."""

    def __init__(self, request_id, tokens, cache_salt=None):
        self.request_id = request_id
        self.py_request_id = request_id
        self.tokens = list(tokens)
        self.cache_salt = cache_salt

    def get_tokens(self, beam):
        return list(self.tokens)


class Executor:
    """TensorRT-LLM's executor and KvCacheConnectorManager in miniature, in their order:
    get_num_new_matched_tokens and update_state_after_alloc when a request gets its blocks, then per
    iteration the scheduler output (each request's deltas since the last one it was in), the
    scheduler's metadata, the worker's step, get_finished."""

    def __init__(self, test, worker_cls=Local, loads_async=False, saves_async=False, chunk=CHUNK):
        self.tmp = tempfile.mkdtemp(prefix="kvs-trt-test-")
        test.addCleanup(shutil.rmtree, self.tmp, True)
        self.model = make_model_dir(self.tmp)
        self.config = write_config(self.tmp, loads_async, saves_async, chunk)
        os.environ["KVSTRATA_CONFIG"] = self.config
        self.sched = kt.KvstrataTrtllmScheduler(llm_args(self.model))
        test.addCleanup(self.sched.shutdown)
        self.w = worker_cls(self.model, self.config)
        test.addCleanup(self.w.close)
        self.free = list(range(N_BLOCKS))
        self.seen = {}  # request id -> (tokens, block ids) reported so far (the output manager's)
        self.external = {}
        self.loading = {}  # parked for an asynchronous load
        self.new_saving = []
        self.new_loading = []
        self.metas = []

    def alloc(self, n):
        out, self.free = self.free[:n], self.free[n:]
        return out

    def add(self, req, table, device_computed=0, take=None):
        """The C++ addSequence path: the connector's offer, the blocks, update_state_after_alloc.
        take: what the runtime honours of the offer (None: all of it)."""
        hit, is_async = self.sched.get_num_new_matched_tokens(req, device_computed)
        if take is not None:
            req.py_num_connector_matched_tokens = take
        else:
            req.py_num_connector_matched_tokens = hit
        self.sched.update_state_after_alloc(req, table)
        req.table = list(table)
        req.position = device_computed
        if is_async:
            self.loading[req.request_id] = req
            self.new_loading.append(req.request_id)
        else:
            self.external[req.request_id] = req.py_num_connector_matched_tokens
            req.position = device_computed + req.py_num_connector_matched_tokens
        return hit, is_async

    def _data(self, req, n_scheduled, generation):
        tokens0, blocks0 = self.seen.get(req.request_id, ([], []))
        new = req.request_id not in self.seen
        rd = standin.RequestData(
            request_id=req.request_id, new_tokens=req.tokens[len(tokens0):],
            new_block_ids=req.table[len(blocks0):],
            computed_position=(len(req.tokens) - 1) if generation else req.position,
            num_scheduled_tokens=n_scheduled, cache_salt=req.cache_salt)
        self.seen[req.request_id] = (list(req.tokens), list(req.table))
        if req.request_id in self.external:
            rd.computed_position -= self.external[req.request_id]
        return new, rd

    def step(self, context=(), generation=()):
        """context: [(request, n tokens computed this step)]; generation: requests decoding one
        token (their last token). Returns the metadata bytes."""
        so = standin.SchedulerOutput()
        work = []
        for req, n in context:
            new, rd = self._data(req, n, False)
            (so.new_requests if new else so.cached_requests).append(rd)
            work.append((list(req.tokens), list(req.table), req.position, req.position + n))
        for req in generation:
            new, rd = self._data(req, 1, True)
            (so.new_requests if new else so.cached_requests).append(rd)
            work.append((list(req.tokens), list(req.table), len(req.tokens) - 1, len(req.tokens)))
        self.external = {}
        meta = self.sched.build_connector_meta(so)
        self.metas.append(meta)
        self.w.call("step", meta, work)
        for req, n in context:
            req.position += n
        return meta

    def finish(self, req):
        keep = self.sched.request_finished(req, list(req.table))
        self.seen.pop(req.request_id, None)
        if keep:
            self.new_saving.append(req.request_id)
        return keep

    def get_finished(self):
        saving, loading = self.new_saving, self.new_loading
        self.new_saving, self.new_loading = [], []
        return self.w.call("get_finished", saving, loading)

    def blocks(self, ids):
        return self.w.call("blocks", ids)


def prompt(seed, n):
    return [(seed * 1000 + i * 17) % 997 + 1 for i in range(n)]


class Restore(unittest.TestCase):
    def test_a_shared_prefix_is_restored_byte_for_byte(self):
        ex = Executor(self)
        a = Request(1, prompt(1, 16))
        hit, is_async = ex.add(a, ex.alloc(4))
        self.assertEqual((hit, is_async), (0, False))
        ex.step(context=[(a, 16)])
        self.assertFalse(ex.finish(a))
        b = Request(2, a.tokens[:12] + prompt(2, 4))
        hit, is_async = ex.add(b, ex.alloc(4))
        self.assertEqual((hit, is_async), (12, False))
        meta = ex.step(context=[(b, 4)])
        self.assertIsInstance(meta, bytes)
        got, want = ex.blocks(b.table[:3]), ex.blocks(a.table[:3])
        self.assertTrue(torch.equal(got.view(torch.int16), want.view(torch.int16)))
        self.assertFalse(torch.equal(got, torch.full_like(got, SENTINEL)))
        # B's own last block is what it computed, not A's
        self.assertFalse(torch.equal(ex.blocks([b.table[3]]), ex.blocks([a.table[3]])))

    def test_requests_of_different_cache_salts_never_share_a_chunk(self):
        ex = Executor(self)
        a = Request(61, prompt(61, 16), cache_salt="team-a")
        ex.add(a, ex.alloc(4))
        ex.step(context=[(a, 16)])
        ex.finish(a)
        other = Request(62, a.tokens[:12] + prompt(62, 4), cache_salt="team-b")
        self.assertEqual(ex.add(other, ex.alloc(4)), (0, False))
        unsalted = Request(63, a.tokens[:12] + prompt(63, 4))
        self.assertEqual(ex.add(unsalted, ex.alloc(4)), (0, False))
        same = Request(64, a.tokens[:12] + prompt(64, 4), cache_salt="team-a")
        self.assertEqual(ex.add(same, ex.alloc(4)), (12, False))

    def test_deltas_over_several_iterations(self):
        ex = Executor(self)
        c = Request(3, prompt(3, 10))
        ex.add(c, ex.alloc(1))  # blocks arrive as the context chunks need them
        ex.step(context=[(c, 4)])
        c.table += ex.alloc(1)
        ex.step(context=[(c, 4)])
        c.table += ex.alloc(1)
        ex.step(context=[(c, 2)])
        for _ in range(5):  # decode: a token per step, a block when one fills
            c.tokens.append((c.tokens[-1] * 7 + 3) % 997)
            if len(c.tokens) > len(c.table) * TPB:
                c.table += ex.alloc(1)
            ex.step(generation=[c])
        ex.finish(c)
        d = Request(4, c.tokens[:10] + prompt(4, 6))
        hit, _ = ex.add(d, ex.alloc(4))
        self.assertEqual(hit, 8)  # the prompt's two whole chunks
        ex.step(context=[(d, 8)])
        got, want = ex.blocks(d.table[:2]), ex.blocks(c.table[:2])
        self.assertTrue(torch.equal(got.view(torch.int16), want.view(torch.int16)))

    def test_minus_one_blocks_are_neither_saved_nor_loaded(self):
        ex = Executor(self)
        e = Request(5, prompt(5, 16))
        table = ex.alloc(4)
        table[0] = -1  # out of the window: TensorRT-LLM holds no page for it
        ex.add(e, table)
        ex.step(context=[(e, 16)])
        saved = ex.w.call("stats")["chunks_saved"]
        self.assertEqual(saved, 3)  # the chunk over the -1 block is not saved
        ex.finish(e)
        f0 = Request(6, e.tokens + [11])
        hit, _ = ex.sched.get_num_new_matched_tokens(f0, 0)
        self.assertEqual(hit, 0)  # the first chunk was never stored
        ex.sched.request_finished(f0, [])
        # the same prompt saved whole, then read by a request whose window passed its first blocks
        e2 = Request(18, e.tokens)
        ex.add(e2, ex.alloc(4))
        ex.step(context=[(e2, 16)])
        ex.finish(e2)
        before = ex.w.call("stats")["chunks_loaded"]
        f = Request(7, e.tokens + [11])
        table = ex.alloc(5)
        table[0] = table[1] = -1
        hit, _ = ex.add(f, table)
        self.assertEqual(hit, 16)
        ex.step(context=[(f, 1)])
        loaded = ex.w.call("loaded_view", [f.table[2], f.table[3]])
        want = ex.blocks([e2.table[2], e2.table[3]])
        self.assertTrue(torch.equal(loaded.view(torch.int16), want.view(torch.int16)))
        # only the two chunks over blocks with pages were loaded
        self.assertEqual(ex.w.call("stats")["chunks_loaded"] - before, 2)

    def test_a_window_load_that_starts_inside_a_chunk_lands_from_there(self):
        # chunks of 4 blocks (16 tokens): the window passed block 1, so the load starts at token
        # 8, in the middle of chunk 0, as it does with the default 256-token chunks
        ex = Executor(self, chunk=4 * TPB)
        a = Request(30, prompt(30, 32))
        ex.add(a, ex.alloc(8))
        ex.step(context=[(a, 32)])
        ex.finish(a)
        before = ex.w.call("stats")["chunks_loaded"]
        f = Request(31, a.tokens + prompt(31, 17))
        table = ex.alloc(13)
        table[0] = table[1] = -1
        hit, is_async = ex.add(f, table)  # must not raise inside TensorRT-LLM's scheduler
        self.assertEqual((hit, is_async), (32, False))
        ex.step(context=[(f, 17)])
        # blocks 2..7 hold a's KV (chunk 0 from token 8 on, chunk 1 whole), loaded before layer 0
        loaded = ex.w.call("loaded_view", f.table[2:8])
        want = ex.blocks(a.table[2:8])
        self.assertTrue(torch.equal(loaded.view(torch.int16), want.view(torch.int16)))
        self.assertEqual(ex.w.call("stats")["chunks_loaded"] - before, 2)
        # what f computed after the load is saved: a third request restores all three chunks
        ex.finish(f)
        g = Request(32, f.tokens[:48] + [3])
        hit, _ = ex.add(g, ex.alloc(13))
        self.assertEqual(hit, 48)
        ex.step(context=[(g, 1)])
        got = ex.w.call("loaded_view", g.table[8:12])
        want = ex.blocks(f.table[8:12])
        self.assertTrue(torch.equal(got.view(torch.int16), want.view(torch.int16)))

    def test_a_window_load_whose_chunks_went_is_logged_not_raised(self):
        ex = Executor(self, chunk=2 * TPB)  # the load starts at a chunk's first token
        a = Request(33, prompt(33, 32))
        ex.add(a, ex.alloc(8))
        ex.step(context=[(a, 32)])
        ex.finish(a)
        handle = ex.sched._handle
        real = handle.lookup
        calls = []

        def lookup(rid, tokens, n_computed):  # the second lookup finds chunk 1 gone
            res = real(rid, tokens, n_computed)
            calls.append(n_computed)
            if len(calls) == 2:
                res = res._replace(hit_tokens=min(res.hit_tokens, 16 - n_computed))
            return res

        handle.lookup = lookup
        self.addCleanup(lambda: setattr(handle, "lookup", real))
        before = ex.w.call("stats")["chunks_loaded"]
        f = Request(34, a.tokens + [11])
        table = ex.alloc(9)
        table[0] = table[1] = -1
        with self.assertLogs("kvstrata", "ERROR") as logs:
            hit, _ = ex.add(f, table)
        self.assertEqual(hit, 32)
        self.assertEqual(calls, [0, 8])
        self.assertIn("no longer stored", logs.records[0].getMessage())
        ex.step(context=[(f, 1)])
        loaded = ex.w.call("loaded_view", f.table[2:4])
        want = ex.blocks(a.table[2:4])
        self.assertTrue(torch.equal(loaded.view(torch.int16), want.view(torch.int16)))
        rest = ex.w.call("loaded_view", f.table[4:8])
        self.assertTrue(torch.equal(rest, torch.full_like(rest, SENTINEL)))
        self.assertEqual(ex.w.call("stats")["chunks_loaded"] - before, 1)

    def test_a_load_the_runtime_does_not_take_does_not_land(self):
        ex = Executor(self)
        a = Request(8, prompt(8, 16))
        ex.add(a, ex.alloc(4))
        ex.step(context=[(a, 16)])
        ex.finish(a)
        g = Request(9, a.tokens[:12] + prompt(9, 4))
        hit, _ = ex.add(g, ex.alloc(4), take=0)  # offered 12, none taken: cancelled
        self.assertEqual(hit, 12)
        before = ex.w.call("stats")["chunks_loaded"]
        ex.step(context=[(g, 16)])
        view = ex.w.call("loaded_view", g.table)
        self.assertTrue(torch.equal(view, torch.full_like(view, SENTINEL)))
        self.assertEqual(ex.w.call("stats")["chunks_loaded"], before)
        # taken in part: only the part taken lands
        h = Request(10, a.tokens[:12] + prompt(10, 4))
        hit, _ = ex.add(h, ex.alloc(4), take=4)
        self.assertEqual(hit, 12)
        ex.step(context=[(h, 12)])
        view = ex.w.call("loaded_view", h.table)
        want = ex.blocks([a.table[0]])
        self.assertTrue(torch.equal(view[0].view(torch.int16), want[0].view(torch.int16)))
        self.assertTrue(torch.equal(view[1:], torch.full_like(view[1:], SENTINEL)))

    def test_a_reset_request_is_sent_whole_again(self):
        ex = Executor(self)
        r = Request(11, prompt(11, 12))
        ex.add(r, ex.alloc(3))
        ex.step(context=[(r, 4)])
        # KvCacheConnectorManager.reset_request_state: its allocation is gone, the deltas with it;
        # it is replayed from the start on new blocks and shows up in new_requests again
        ex.seen.pop(r.request_id)
        r.table, r.position = ex.alloc(3), 0
        ex.step(context=[(r, 12)])
        ex.finish(r)
        s = Request(12, r.tokens + [5])
        hit, _ = ex.add(s, ex.alloc(4))
        self.assertEqual(hit, 12)
        ex.step(context=[(s, 1)])
        got, want = ex.blocks(s.table[:3]), ex.blocks(r.table)
        self.assertTrue(torch.equal(got.view(torch.int16), want.view(torch.int16)))


class Finished(unittest.TestCase):
    def test_an_asynchronous_load_is_reported_once_passed_in(self):
        ex = Executor(self, loads_async=True)
        a = Request(13, prompt(13, 16))
        ex.add(a, ex.alloc(4))
        ex.step(context=[(a, 16)])
        ex.finish(a)
        b = Request(14, a.tokens[:12] + prompt(14, 4))
        hit, is_async = ex.add(b, ex.alloc(4))
        self.assertEqual((hit, is_async), (12, True))
        ex.step()  # b is parked: not in the scheduler output, its load emitted all the same
        # kvstrata may have landed it already: not reported before TensorRT-LLM passed it in
        self.assertEqual(ex.w.call("get_finished", [], []), ([], []))
        done = ex.get_finished()
        for _ in range(200):
            if done[1]:
                break
            ex.step()
            done = ex.get_finished()
        self.assertEqual(done, ([], [b.request_id]))
        got, want = ex.blocks(b.table[:3]), ex.blocks(a.table[:3])
        self.assertTrue(torch.equal(got.view(torch.int16), want.view(torch.int16)))

    def test_a_failed_asynchronous_load_is_never_reported_loaded(self):
        ex = Executor(self, loads_async=True)
        a = Request(40, prompt(40, 16))
        ex.add(a, ex.alloc(4))
        ex.step(context=[(a, 16)])
        ex.finish(a)
        with open(ex.config) as f:
            shm = re.search(r"shm_name: (\S+)", f.read()).group(1)
        needle = kv_value(a.tokens, 5, 0, 0).to(torch.float16).numpy().tobytes()  # chunk 1's
        with open(os.path.join("/dev/shm", shm), "r+b") as f:
            data = f.read()
            at = data.find(needle)
            self.assertGreaterEqual(at, 0, "the chunk is in the shared DRAM tier")
            f.seek(at + 3)
            f.write(bytes([data[at + 3] ^ 0xFF]))
        b = Request(41, a.tokens[:12] + prompt(41, 4))
        self.assertEqual(ex.add(b, ex.alloc(4)), (12, True))
        raised, reported, calls = [], [], 0

        def attempt(call):  # an executor that catches the error and goes on
            try:
                return call()
            except kt.KvstrataTrtllmError as e:
                raised.append(str(e))
                return None

        # the load runs between steps: its failure is raised at the end of the step it ended in
        # (wait_for_save) or by the get_finished that would have reported it, whichever comes first
        attempt(ex.step)
        while not raised and calls < 100:
            calls += 1
            done = attempt(ex.get_finished)
            reported += done[1] if done else []
            attempt(ex.step)
        self.assertEqual(len(raised), 1, "the failed load is raised once")
        for _ in range(3):  # and never reported as loaded afterwards
            done = attempt(ex.get_finished)
            reported += done[1] if done else []
            attempt(ex.step)
        self.assertEqual(len(raised), 1, "and only once")
        self.assertEqual(reported, [])
        self.assertGreaterEqual(ex.w.call("stats")["load_errors"], 1)

    def test_asynchronous_saves_keep_the_blocks_until_reported(self):
        ex = Executor(self, saves_async=True)
        a = Request(15, prompt(15, 16))
        ex.add(a, ex.alloc(4))
        ex.step(context=[(a, 16)])
        self.assertTrue(ex.finish(a))
        done = ex.get_finished()
        for _ in range(200):
            if done[0]:
                break
            ex.step()
            done = ex.get_finished()
        self.assertEqual(done, ([a.request_id], []))
        self.assertEqual(ex.get_finished(), ([], []))  # once


class TwoProcesses(unittest.TestCase):
    def test_worker_in_its_own_process(self):
        ex = Executor(self, worker_cls=RemoteWorker)
        a = Request(16, prompt(16, 16))
        ex.add(a, ex.alloc(4))
        ex.step(context=[(a, 16)])
        ex.finish(a)
        b = Request(17, a.tokens[:12] + prompt(17, 4))
        hit, _ = ex.add(b, ex.alloc(4))
        self.assertEqual(hit, 12)
        ex.step(context=[(b, 4)])
        self.assertTrue(all(isinstance(m, bytes) for m in ex.metas))
        got, want = ex.blocks(b.table[:3]), ex.blocks(a.table[:3])
        self.assertTrue(torch.equal(got.view(torch.int16), want.view(torch.int16)))
        self.assertNotEqual(ex.w.proc.pid, os.getpid())


class RemoteWorker(Actor):
    def __init__(self, *args):
        super().__init__(WorkerSide, *args)


class Signatures(unittest.TestCase):
    OWN = {"shutdown"}  # kvstrata's, no hook of TensorRT-LLM's

    def compare(self, cls, base):
        for name, member in vars(cls).items():
            if name.startswith("_") and name != "__init__" or name in self.OWN:
                continue
            self.assertTrue(hasattr(base, name), f"{cls.__name__}.{name} is not one of "
                            f"{base.__name__}'s hooks")
            mine = [(p.name, p.kind) for p in inspect.signature(member).parameters.values()]
            ref = [(p.name, p.kind)
                   for p in inspect.signature(getattr(base, name)).parameters.values()]
            self.assertEqual(mine, ref, name)

    def test_methods_have_the_stand_ins_signatures(self):
        self.compare(kt.KvstrataTrtllmScheduler, standin.KvCacheConnectorScheduler)
        self.compare(kt.KvstrataTrtllmWorker, standin.KvCacheConnectorWorker)

    @unittest.skipUnless(kt.HAVE_TRTLLM, "TensorRT-LLM is not installed here")
    def test_methods_have_trtllms_signatures(self):
        self.compare(kt.KvstrataTrtllmScheduler, kt.KvCacheConnectorScheduler)
        self.compare(kt.KvstrataTrtllmWorker, kt.KvCacheConnectorWorker)

    def test_the_classes_are_complete(self):
        self.assertEqual(kt.KvstrataTrtllmScheduler.__abstractmethods__, frozenset())
        self.assertEqual(kt.KvstrataTrtllmWorker.__abstractmethods__, frozenset())
        for name in ("build_connector_meta", "get_num_new_matched_tokens", "request_finished",
                     "update_state_after_alloc"):
            self.assertIn(name, vars(kt.KvstrataTrtllmScheduler))
        for name in ("register_kv_caches", "bind_connector_meta", "start_load_kv",
                     "wait_for_layer_load", "save_kv_layer", "wait_for_save", "get_finished"):
            self.assertIn(name, vars(kt.KvstrataTrtllmWorker))

    def test_the_stand_in_says_what_it_is(self):
        with open(standin.__file__) as f:
            first = f.readline()
        self.assertTrue(first.startswith("# Names and signatures only: stand-ins for"))
        self.assertIn("035ab91cad04", standin.__doc__)


class Views(unittest.TestCase):
    def test_layer_views_follow_the_pool_strides(self):
        tmp = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, tmp, True)
        desc = kt.describe_model(llm_args(make_model_dir(tmp)), scheduler=False, tp_rank=0)
        pool = torch.zeros((6, LAYERS, 2, HEADS * TPB * HEAD_DIM), dtype=torch.float16)
        views = kt.pool_layer_views(pool, desc)
        e = 2
        self.assertEqual(len(views), LAYERS)
        for layer, v in enumerate(views):
            self.assertEqual(v.device_kind, _abi.DEVICE_HOST)
            self.assertEqual(v.n_blocks, 6)
            self.assertEqual(v.k_base, pool[0, layer, 0].data_ptr())
            self.assertEqual(v.v_base, pool[0, layer, 1].data_ptr())
            self.assertEqual(v.block_stride, pool[1].data_ptr() - pool[0].data_ptr())
            self.assertEqual(v.head_stride, TPB * HEAD_DIM * e)
            self.assertEqual(v.token_stride, HEAD_DIM * e)
        with self.assertRaises(kt.KvstrataTrtllmError):  # 3 layers where the model has 2
            kt.pool_layer_views(torch.zeros((6, 3, 2, HEADS * TPB * HEAD_DIM),
                                            dtype=torch.float16), desc)
        with self.assertRaises(kt.KvstrataTrtllmError):  # the wrong dtype
            kt.pool_layer_views(pool.float(), desc)

    def test_minus_one_becomes_block_none(self):
        self.assertEqual(list(kt._block_ids([3, -1, 7])), [3, 0xFFFFFFFF, 7])


if __name__ == "__main__":
    unittest.main()
