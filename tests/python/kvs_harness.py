"""Replay harness: drives KvstrataConnector in vLLM's call order, in vLLM's process layout.

The test process is the driver. A scheduler process holds a small vLLM-like scheduler (waiting and
running queues, a block pool, chunked prefill, preemption, WAITING_FOR_REMOTE_KVS) with the
SCHEDULER-role connector, and builds each step's SchedulerOutput with the connector's metadata. One
worker process per tensor-parallel rank holds the WORKER-role connector, the paged KV cache as torch
CPU tensors in one of vLLM's layouts and a tiny "model" that writes, for every token, KV bytes that are
a function of the token's prefix, layer, KV head and element, so a restored page can be compared byte
for byte with a recomputed one. The driver pickles the scheduler output to the workers and their
outputs back, aggregating them as vLLM's executor does (a transfer is finished when every rank
reports it).

The request and scheduler-output classes mirror the field names of vLLM's Request, KVCacheBlocks,
NewRequestData, CachedRequestData and SchedulerOutput (vllm/v1/core/sched/output.py); the config
classes mirror the attributes KvstrataConnector reads from VllmConfig.
"""

import collections
import dataclasses
import importlib
import multiprocessing
import os
import shutil
import tempfile
import traceback
import unittest
import uuid
from dataclasses import dataclass, field
from typing import Any

# --- vLLM-like configuration ---------------------------------------------------------------------


class ModelConfig:
    def __init__(self, spec):
        self.model = spec["model_id"]
        self.dtype = spec["model_dtype"]
        self.use_mla = spec["mla"]
        self.revision = None
        self.quantization = None
        self._spec = spec

    def get_num_kv_heads(self, parallel_config):
        return max(1, self._spec["heads_total"] // parallel_config.tensor_parallel_size)

    def get_head_size(self):
        return self._spec["head_dim"]

    def get_num_layers_by_block_type(self, parallel_config, block_type="attention"):
        return self._spec["n_layers"]

    def get_num_layers(self, parallel_config):
        return self._spec["n_layers"]

    def get_vocab_size(self):
        return self._spec["vocab"]


@dataclass
class CacheConfig:
    block_size: int
    cache_dtype: str = "auto"
    num_gpu_blocks: int = 0


@dataclass
class ParallelConfig:
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    rank: int = 0


@dataclass
class KVTransferConfig:
    kv_connector: str = "KvstrataConnector"
    kv_connector_module_path: str = "kvstrata.vllm"
    kv_role: str = "kv_both"
    kv_load_failure_policy: str = "recompute"
    kv_connector_extra_config: dict = field(default_factory=dict)
    engine_id: str = ""

    @property
    def is_kv_producer(self):
        return self.kv_role in ("kv_producer", "kv_both")

    @property
    def is_kv_consumer(self):
        return self.kv_role in ("kv_consumer", "kv_both")


@dataclass
class VllmConfig:
    model_config: Any
    cache_config: CacheConfig
    parallel_config: ParallelConfig
    kv_transfer_config: KVTransferConfig
    lora_config: Any = None


@dataclass
class FullAttentionSpec:
    block_size: int
    num_kv_heads: int
    head_size: int
    dtype: Any = None


@dataclass
class SlidingWindowSpec:
    block_size: int
    num_kv_heads: int
    head_size: int
    sliding_window: int
    dtype: Any = None


def first_held(spec, n_computed):
    """A sliding-window group's first token whose block is not the null block (vLLM's
    get_num_skipped_tokens, rounded down to a block)."""
    skipped = max(0, n_computed - spec["window"] + 1)
    return skipped // spec["block_size"] * spec["block_size"]


def window_layer_names(spec):
    n = spec["n_layers"]
    return [f"model.layers.{n + i}.self_attn.attn" for i in range(spec.get("window_layers", 0))]


@dataclass
class KVCacheGroupSpec:
    layer_names: list
    kv_cache_spec: Any


@dataclass
class KVCacheTensor:
    size: int
    shared_by: list


@dataclass
class KVCacheConfig:
    num_blocks: int
    kv_cache_tensors: list
    kv_cache_groups: list


def layer_names(n):
    return [f"model.layers.{i}.self_attn.attn" for i in range(n)]


def make_vllm_config(spec, rank=0):
    extra = dict(spec["extra_config"])
    ktc = KVTransferConfig(kv_connector_extra_config=extra, engine_id=spec["engine_id"],
                           kv_role=spec.get("kv_role", "kv_both"))
    return VllmConfig(
        model_config=ModelConfig(spec),
        cache_config=CacheConfig(block_size=spec["block_size"], cache_dtype=spec["cache_dtype"],
                                 num_gpu_blocks=spec["n_blocks"]),
        parallel_config=ParallelConfig(tensor_parallel_size=spec["tp"], rank=rank),
        kv_transfer_config=ktc)


def make_kv_cache_config(spec):
    names = layer_names(spec["n_layers"])
    heads = 1 if spec["mla"] else spec["heads_total"] // spec["tp"]
    kcc = KVCacheConfig(
        num_blocks=spec["n_blocks"],
        kv_cache_tensors=[KVCacheTensor(size=0, shared_by=[n]) for n in names],
        kv_cache_groups=[KVCacheGroupSpec(layer_names=names, kv_cache_spec=FullAttentionSpec(
            block_size=spec["block_size"], num_kv_heads=heads, head_size=spec["head_dim"]))])
    if spec.get("window"):  # a hybrid model: group 1 holds the sliding-window layers
        wnames = window_layer_names(spec)
        kcc.kv_cache_tensors += [KVCacheTensor(size=0, shared_by=[n]) for n in wnames]
        kcc.kv_cache_groups.append(KVCacheGroupSpec(layer_names=wnames, kv_cache_spec=SlidingWindowSpec(
            block_size=spec["block_size"], num_kv_heads=heads, head_size=spec["head_dim"],
            sliding_window=spec["window"])))
    return kcc


# --- vLLM-like requests and scheduler output -------------------------------------------------------

WAITING = "WAITING"
WAITING_FOR_REMOTE_KVS = "WAITING_FOR_REMOTE_KVS"
RUNNING = "RUNNING"
PREEMPTED = "PREEMPTED"
FINISHED = "FINISHED"


class Request:
    """The fields of vllm.v1.request.Request the connector and this scheduler read."""

    def __init__(self, request_id, prompt_token_ids, max_tokens, lora_request=None,
                 cache_salt=None, mm_features=None, kv_transfer_params=None):
        self.request_id = request_id
        self.kv_transfer_params = kv_transfer_params
        self.prompt_token_ids = list(prompt_token_ids)
        self._output_token_ids = []
        self._all_token_ids = list(prompt_token_ids)
        self.max_tokens = max_tokens
        self.num_computed_tokens = 0
        self.num_external_computed_tokens = 0
        self.num_preemptions = 0
        # async scheduling: tokens scheduled to be sampled whose ids are not known yet
        self.num_output_placeholders = 0
        self.status = WAITING
        self.lora_request = lora_request
        self.cache_salt = cache_salt
        self.mm_features = list(mm_features or [])
        self.prompt_embeds = None
        self.sampling_params = None
        self.pooling_params = None

    @property
    def all_token_ids(self):
        return self._all_token_ids

    @property
    def num_tokens(self):
        return len(self._all_token_ids)

    @property
    def num_prompt_tokens(self):
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self):
        return len(self._output_token_ids)

    def append_output_token_ids(self, tok):
        self._output_token_ids.append(tok)
        self._all_token_ids.append(tok)


@dataclass
class LoRARequest:
    lora_name: str
    lora_path: str


@dataclass
class PlaceholderRange:
    offset: int
    length: int


@dataclass
class MultiModalFeature:
    """The fields of vLLM's MultiModalFeatureSpec the connector reads."""
    identifier: str
    mm_position: PlaceholderRange


class KVCacheBlocks:
    def __init__(self, block_ids, window_ids=None):
        self._ids = list(block_ids)
        self._wids = None if window_ids is None else list(window_ids)

    def get_block_ids(self, allow_none=False):
        if self._wids is None:
            return (list(self._ids),)
        return (list(self._ids), list(self._wids))


@dataclass
class NewRequestData:
    req_id: str
    prompt_token_ids: list
    mm_features: list
    sampling_params: Any
    pooling_params: Any
    block_ids: tuple
    num_computed_tokens: int
    lora_request: Any
    prompt_embeds: Any = None
    prefill_token_ids: Any = None


@dataclass
class CachedRequestData:
    req_ids: list
    resumed_req_ids: set
    new_token_ids: list
    all_token_ids: dict
    new_block_ids: list
    num_computed_tokens: list
    num_output_tokens: list


@dataclass
class LegacyCachedRequestData:
    # vLLM releases before resumed_req_ids: one flag per cached request
    req_ids: list
    resumed_from_preemption: list
    new_token_ids: list
    all_token_ids: dict
    new_block_ids: list
    num_computed_tokens: list
    num_output_tokens: list


def resumed_ids(cached):
    flags = getattr(cached, "resumed_from_preemption", None)
    if flags is not None:
        return {rid for rid, flag in zip(cached.req_ids, flags) if flag}
    return cached.resumed_req_ids


@dataclass
class SchedulerOutput:
    scheduled_new_reqs: list
    scheduled_cached_reqs: CachedRequestData
    num_scheduled_tokens: dict
    total_num_scheduled_tokens: int
    scheduled_spec_decode_tokens: dict
    scheduled_encoder_inputs: dict
    num_common_prefix_blocks: list
    finished_req_ids: set
    free_encoder_mm_hashes: list
    preempted_req_ids: Any = None
    pending_structured_output_tokens: bool = False
    kv_connector_metadata: Any = None
    ec_connector_metadata: Any = None


@dataclass
class WorkerOutput:
    rank: int
    sampled: dict
    finished_sending: Any
    finished_recving: Any
    invalid_block_ids: set
    stats: Any
    calls: list


@dataclass
class StepOutput:
    """What the driver hands back to the scheduler (vLLM's aggregated KVConnectorOutput + samples)."""

    sampled: dict
    finished_sending: set
    finished_recving: set
    invalid_block_ids: set


def sample(tokens, vocab):
    """The tiny model's next token: a function of the last token and the length."""
    return (tokens[-1] * 1103515245 + len(tokens) * 12345 + 7) % vocab


# --- the scheduler process -------------------------------------------------------------------------


class SchedulerRunner:
    """A small vLLM scheduler (v1's algorithm, simplified: no local prefix cache, no spec decode)
    around the SCHEDULER-role connector.

    async_scheduling (default spec["async_scheduling"]): vLLM's AsyncScheduler contract. The engine
    schedules step k+1 before update_from_output gets step k's output, so each scheduled step that
    samples adds an output placeholder to the request (num_output_placeholders: a token position
    already counted in num_computed_tokens whose id is not in all_token_ids yet) and a running
    request is scheduled again on it; the output removes it. CachedRequestData.num_output_tokens
    counts the placeholders, a preempted request loses them, and the token its in-flight step
    samples is still delivered to it (vLLM's stale output); it resumes only after that."""

    def __init__(self, spec, async_scheduling=None):
        from kvstrata import vllm as kv

        self.async_scheduling = bool(spec.get("async_scheduling", False)
                                     if async_scheduling is None else async_scheduling)
        self.inflight = collections.deque()  # the scheduled steps whose output has not come back
        self.stale = collections.Counter()  # preempted: rid -> in-flight steps still to deliver

        self.spec = spec
        self.bs = spec["block_size"]
        self.vocab = spec["vocab"]
        self.budget = spec["token_budget"]
        self.conn = kv.KvstrataConnector(make_vllm_config(spec), kv.KVConnectorRole.SCHEDULER,
                                         make_kv_cache_config(spec))
        self.window = spec.get("window")
        # a hybrid model's pool reserves block 0 as vLLM's null block (never anyone's)
        order = list(range(1 if self.window else 0, spec["n_blocks"]))
        order.sort(key=lambda b: (b * 7919) % spec["n_blocks"])  # non-contiguous block tables
        self.free = collections.deque(order)
        self.requests = {}
        self.blocks = {}
        self.wblocks = {}  # hybrid: the sliding-window group's tables (0: the null block)
        self.waiting = collections.deque()
        self.running = []
        self.finished_req_ids = set()
        self.prev_scheduled = set()
        self.finished_recving = set()
        self.failed_recving = set()
        self.to_preempt = []
        self.delayed_free = set()  # aborted while their KV loaded: blocks wait for finished_recving
        self.kept = {}  # finished, request_finished said keep: rid -> blocks, until finished_sending
        self.stats_since = None  # connector stats vLLM collected per step, not read yet
        self.lookups = collections.defaultdict(list)  # rid -> [(num_computed, result)]
        self.last_output = None
        self.finished_results = {}
        self.on_alloc_calls = collections.defaultdict(list)  # rid -> [n_external_tokens] the library got
        handle = self.conn._handle
        real_on_alloc = handle.on_alloc

        def on_alloc(req_id, block_ids, n_external):
            self.on_alloc_calls[req_id].append(n_external)
            return real_on_alloc(req_id, block_ids, n_external)

        handle.on_alloc = on_alloc

    # -- driver API --

    def add_request(self, rid, prompt, max_tokens, lora=False, cache_salt=None, mm=(),
                    kv_transfer_params=None):
        """lora: False, True (adapter "adapter") or an adapter name; mm: (hash, offset, length)
        of each multimodal input, in position order."""
        lora_request = None
        if lora:
            name = "adapter" if lora is True else str(lora)
            lora_request = LoRARequest(name, f"/adapters/{name}")
        feats = [MultiModalFeature(h, PlaceholderRange(o, n)) for h, o, n in mm]
        req = Request(rid, prompt, max_tokens, lora_request=lora_request, cache_salt=cache_salt,
                      mm_features=feats, kv_transfer_params=kv_transfer_params)
        self.requests[rid] = req
        self.waiting.append(req)
        self.conn.on_new_request(req)

    def use_legacy_cached(self):
        """Emit CachedRequestData as vLLM releases before resumed_req_ids did."""
        self.legacy_cached = True

    def preempt(self, rid):
        self.to_preempt.append(rid)

    def rewind(self, rid, n_computed):
        """A running request's computed tokens set back to n_computed (what vLLM's recovery from
        a failed load does to every running request holding a failed block): it recomputes from
        there in its next steps, on the same blocks."""
        self.requests[rid].num_computed_tokens = n_computed

    def abort(self, rid):
        req = self.requests.get(rid)
        if req is None or req.status == FINISHED:
            return None
        if req in self.running:
            self.running.remove(req)
        if req in self.waiting:
            self.waiting.remove(req)
        loading = req.status == WAITING_FOR_REMOTE_KVS and rid not in self.finished_recving
        self.finished_recving.discard(rid)
        self.failed_recving.discard(rid)
        return self._finish(req, delay_free=loading)

    def info(self, rid):
        req = self.requests[rid]
        return {"tokens": list(req.all_token_ids), "block_ids": list(self.blocks.get(rid, [])),
                "num_computed": req.num_computed_tokens, "status": req.status,
                "num_external": req.num_external_computed_tokens,
                "lookups": list(self.lookups.get(rid, [])),
                "num_preemptions": req.num_preemptions,
                "placeholders": req.num_output_placeholders,
                "on_alloc": list(self.on_alloc_calls.get(rid, [])),
                "connector_block_ids": self.conn_block_ids(rid),
                "connector_watched": sorted(getattr(self.conn, "_watch", ())),
                "finished_result": self.finished_results.get(rid),
                "kept_block_ids": list(self.kept.get(rid, [])),
                "window_block_ids": list(self.wblocks.get(rid, [])),
                "free": list(self.free)}

    def conn_block_ids(self, rid):
        """The block table the scheduler-side connector keeps for rid (None when it keeps none)."""
        st = getattr(self.conn, "_requests", {}).get(rid)
        return None if st is None or st.block_ids is None else list(st.block_ids)

    def probe_lookup(self, rid, tokens, num_computed):
        """get_num_new_matched_tokens for a request this scheduler does not run (then finished)."""
        req = Request(rid, tokens, 1)
        try:
            return self.conn.get_num_new_matched_tokens(req, num_computed)
        finally:
            self.conn.update_state_after_alloc(req, KVCacheBlocks([]), 0)
            self.conn.request_finished(req, [])

    def group_hit(self, group, rid, tokens, num_computed):
        """What KV cache group `group`'s handle alone finds for tokens (then forgets rid)."""
        h = self.conn._handles[group]
        res = h.lookup(rid, tokens, num_computed)
        h.on_alloc(rid, [], 0)
        h.request_finished(rid)
        return res.hit_tokens

    def reset_connector_cache(self):
        """vLLM's reset_prefix_cache(reset_connector=True): the connector's answer."""
        return self.conn.reset_cache()

    def _collect_stats(self):
        """What vLLM's update_from_output does each step: the scheduler-side connector's counters
        since it last asked, kept here (summed) until the test reads them."""
        s = self.conn.get_kv_connector_stats()
        if s is not None and not s.is_empty():
            self.stats_since = s if self.stats_since is None else self.stats_since.aggregate(s)

    def connector_stats(self):
        self._collect_stats()
        s, self.stats_since = self.stats_since, None
        return None if s is None else dict(s.data)

    def shutdown(self):
        self.conn.shutdown()

    # -- blocks --

    def _allocate(self, req, total_tokens, computed=None):
        have = self.blocks.setdefault(req.request_id, [])
        need = -(-total_tokens // self.bs) - len(have)
        if not self.window:
            if need > len(self.free):
                return None
            new = [self.free.popleft() for _ in range(max(0, need))]
            have.extend(new)
            return new
        # the window group: blocks out of the window become the null block (freed), as vLLM's
        # remove_skipped_blocks does before it allocates; new ones below the window are null
        computed = req.num_computed_tokens if computed is None else computed
        skip = first_held(self.spec, computed) // self.bs
        wh = self.wblocks.setdefault(req.request_id, [])
        for i in range(min(skip, len(wh))):
            if wh[i]:
                self.free.append(wh[i])
                wh[i] = 0
        wneed = -(-total_tokens // self.bs) - len(wh)
        wreal = sum(1 for i in range(len(wh), len(wh) + max(0, wneed)) if i >= skip)
        if max(0, need) + wreal > len(self.free):
            return None
        new = [self.free.popleft() for _ in range(max(0, need))]
        have.extend(new)
        wnew = [0 if i < skip else self.free.popleft()
                for i in range(len(wh), len(wh) + max(0, wneed))]
        wh.extend(wnew)
        return (new, wnew)

    def _tables(self, rid):
        if not self.window:
            return (list(self.blocks.get(rid, [])),)
        return (list(self.blocks.get(rid, [])), list(self.wblocks.get(rid, [])))

    def _free_blocks(self, req):
        self.free.extend(self.blocks.pop(req.request_id, []))
        self.free.extend(b for b in self.wblocks.pop(req.request_id, []) if b)

    def _finish(self, req, delay_free=False):
        req.status = FINISHED
        result = self.conn.request_finished_all_groups(req, self._tables(req.request_id))
        self.finished_results[req.request_id] = result
        self.finished_req_ids.add(req.request_id)
        if delay_free:  # vLLM frees them when a worker reports the load finished
            self.delayed_free.add(req.request_id)
        elif not result[0]:
            self._free_blocks(req)
        else:  # vLLM frees them when every worker reported the request in finished_sending
            self.kept[req.request_id] = list(self.blocks.get(req.request_id, []))
        return result

    def are_free(self, block_ids):
        free = set(self.free)
        return all(b in free for b in block_ids)

    # -- one step --

    def _update_waiting_for_remote_kv(self, req):
        rid = req.request_id
        if rid not in self.finished_recving:
            return False
        if rid in self.failed_recving:
            self.failed_recving.discard(rid)
        else:
            n = min(len(self.blocks.get(rid, [])) * self.bs, req.num_tokens)
            if n == req.num_tokens:
                n -= 1
            req.num_computed_tokens = n
        self.finished_recving.discard(rid)
        return True

    def schedule(self):
        budget = self.budget
        num_scheduled, new_blocks = {}, {}
        sched_new, sched_resumed, sched_running, preempted = [], [], [], []
        for rid in self.to_preempt:
            req = self.requests[rid]
            if req in self.running:
                self.running.remove(req)
                self._free_blocks(req)
                req.status = PREEMPTED
                req.num_computed_tokens = 0
                req.num_preemptions += 1
                req.num_output_placeholders = 0
                n_stale = sum(1 for so in self.inflight if rid in so.num_scheduled_tokens)
                if n_stale:
                    self.stale[rid] = n_stale
                self.waiting.appendleft(req)
                preempted.append(req)
        self.to_preempt = []
        for req in list(self.running):
            if budget <= 0:
                break
            ph = req.num_output_placeholders
            if ph and req.num_output_tokens + ph >= req.max_tokens:
                continue  # async: the steps in flight already sample its last token
            n = min(req.num_tokens + ph - req.num_computed_tokens, budget)
            if n <= 0:
                continue
            got = self._allocate(req, req.num_computed_tokens + n, req.num_computed_tokens)
            if got is None:
                break
            sched_running.append(req)
            num_scheduled[req.request_id] = n
            new_blocks[req.request_id] = got
            budget -= n
        if not preempted:
            skipped = []
            while self.waiting and budget > 0:
                req = self.waiting[0]
                rid = req.request_id
                if self.stale.get(rid):  # its stale output is still in flight
                    skipped.append(self.waiting.popleft())
                    continue
                if req.status == WAITING_FOR_REMOTE_KVS:
                    if self._update_waiting_for_remote_kv(req):
                        req.status = PREEMPTED if req.num_preemptions else WAITING
                    else:
                        skipped.append(self.waiting.popleft())
                        continue
                ext, load_async = 0, False
                if req.num_computed_tokens == 0:
                    ext, load_async = self.conn.get_num_new_matched_tokens(req, 0)
                    self.lookups[rid].append((0, ext, load_async))
                    if ext is None:
                        skipped.append(self.waiting.popleft())
                        continue
                    req.num_external_computed_tokens = ext
                    computed = ext
                else:
                    computed = req.num_computed_tokens
                if load_async:
                    assert ext > 0
                    n = 0
                else:
                    n = min(req.num_tokens - computed, budget)
                    assert n > 0, (rid, computed, req.num_tokens)
                if self._allocate(req, computed + n, computed) is None:
                    break
                self.conn.update_state_after_alloc(
                    req, KVCacheBlocks(self.blocks[rid], self.wblocks.get(rid) if self.window
                                       else None), ext)
                self.waiting.popleft()
                if load_async:
                    req.status = WAITING_FOR_REMOTE_KVS
                    skipped.append(req)
                    continue
                self.running.append(req)
                (sched_resumed if req.status == PREEMPTED else sched_new).append(req)
                num_scheduled[rid] = n
                budget -= n
                req.status = RUNNING
                req.num_computed_tokens = computed
            self.waiting.extendleft(reversed(skipped))
        new_reqs = [NewRequestData(
            req_id=r.request_id, prompt_token_ids=list(r.prompt_token_ids),
            mm_features=list(r.mm_features), sampling_params=None, pooling_params=None,
            block_ids=self._tables(r.request_id), num_computed_tokens=r.num_computed_tokens,
            lora_request=r.lora_request) for r in sched_new]
        cached = CachedRequestData([], set(), [], {}, [], [], [])
        for i, r in enumerate(sched_running + sched_resumed):
            rid = r.request_id
            cached.req_ids.append(rid)
            if i >= len(sched_running):
                cached.resumed_req_ids.add(rid)
                cached.new_block_ids.append(self._tables(rid))
            elif self.window:
                nb = new_blocks[rid]
                cached.new_block_ids.append((list(nb[0]), list(nb[1])) if nb[0] or nb[1] else None)
            else:
                cached.new_block_ids.append((list(new_blocks[rid]),) if new_blocks[rid] else None)
            if rid not in self.prev_scheduled:
                cached.all_token_ids[rid] = list(r.all_token_ids)
            cached.num_computed_tokens.append(r.num_computed_tokens)
            cached.num_output_tokens.append(r.num_output_tokens + r.num_output_placeholders)
        if getattr(self, "legacy_cached", False):
            cached = LegacyCachedRequestData(
                cached.req_ids, [rid in cached.resumed_req_ids for rid in cached.req_ids],
                cached.new_token_ids, cached.all_token_ids, cached.new_block_ids,
                cached.num_computed_tokens, cached.num_output_tokens)
        so = SchedulerOutput(
            scheduled_new_reqs=new_reqs, scheduled_cached_reqs=cached,
            num_scheduled_tokens=num_scheduled,
            total_num_scheduled_tokens=sum(num_scheduled.values()),
            scheduled_spec_decode_tokens={}, scheduled_encoder_inputs={},
            num_common_prefix_blocks=[0], finished_req_ids=self.finished_req_ids,
            free_encoder_mm_hashes=[], preempted_req_ids={r.request_id for r in preempted})
        so.kv_connector_metadata = self.conn.build_connector_meta(so)
        for rid, n in num_scheduled.items():
            req = self.requests[rid]
            req.num_computed_tokens += n
            if (self.async_scheduling
                    and req.num_computed_tokens >= req.num_tokens + req.num_output_placeholders):
                req.num_output_placeholders += 1  # the step samples a token not known until then
        self.finished_req_ids = set()
        self.prev_scheduled = set(num_scheduled)
        self.last_output = so
        self.inflight.append(so)
        return so

    def placeholders(self, rid):
        return self.requests[rid].num_output_placeholders

    def _handle_invalid_blocks(self, invalid):
        failed = set()
        for rid, blocks in self.blocks.items():
            req = self.requests[rid]
            bad = [i for i, b in enumerate(blocks) if b in invalid]
            if not bad or req.status == FINISHED:
                continue
            valid = bad[0] * self.bs
            if req.status == WAITING_FOR_REMOTE_KVS:
                self.failed_recving.add(rid)
                req.num_computed_tokens = valid
            else:
                failed.add(rid)
                req.num_computed_tokens = min(req.num_computed_tokens, valid)
        return failed

    def update_from_output(self, out):
        """The output of the oldest step in flight (with synchronous scheduling, the last one)."""
        so = self.inflight.popleft()
        failed = self._handle_invalid_blocks(out.invalid_block_ids) if out.invalid_block_ids else set()
        for rid in so.num_scheduled_tokens:
            req = self.requests.get(rid)
            stale = False
            if self.stale.get(rid):
                stale = True
                self.stale[rid] -= 1
                if not self.stale[rid]:
                    del self.stale[rid]
            if req is None or req.status == FINISHED or rid in failed:
                continue
            if req.status != RUNNING and not stale:
                continue
            tok = out.sampled.get(rid)
            if tok is None:
                continue
            req.append_output_token_ids(tok)
            if self.async_scheduling and not stale:
                req.num_output_placeholders -= 1
                assert req.num_output_placeholders >= 0, rid
            if req.num_output_tokens >= req.max_tokens:
                if req in self.running:
                    self.running.remove(req)
                if req in self.waiting:
                    self.waiting.remove(req)
                self._finish(req)
        for rid in out.finished_recving:
            if rid in self.delayed_free:
                self.delayed_free.discard(rid)
                self._free_blocks(self.requests[rid])
            else:
                self.finished_recving.add(rid)
        for rid in out.finished_sending:
            req = self.requests.get(rid)
            # vLLM asserts a sending report names a request whose pages it kept
            assert rid in self.kept, f"{rid} reported in finished_sending, its pages were not kept"
            del self.kept[rid]
            if req is not None:
                self._free_blocks(req)
        self._collect_stats()
        return {"failed": sorted(failed)}


# --- the paged cache and the tiny model -------------------------------------------------------------

_P = 2147483647  # 2^31 - 1: the model's arithmetic stays below 2^63 (no overflow)


def prefix_codes(tokens):
    """One code per position, a function of the tokens up to and including it."""
    out = []
    h = 1469598103934665603
    for t in tokens:
        h = ((h ^ (int(t) & 0xFFFFFFFF)) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
        out.append(h % _P)
    return out


class CrossLayerBackend:
    """What register_cross_layers_kv_cache reads of an attention backend: the physical order of
    (layers, 2, blocks, block, heads, head) — vLLM's FlashAttention NHD puts blocks first."""

    @staticmethod
    def get_kv_cache_stride_order(include_num_layers_dimension=False):
        return (2, 0, 1, 3, 4, 5) if include_num_layers_dimension else (0, 1, 2, 3, 4)


def test_device():
    """Where the workers' paged caches live: KVS_TEST_DEVICE (cpu, the default, or cuda)."""
    return os.environ.get("KVS_TEST_DEVICE", "cpu")


class PagedCache:
    """One rank's KV cache as torch tensors in `layout` on spec["device"] (CPU or CUDA), and the
    tiny model over it."""

    LAYOUTS = ("nhd", "hnd", "flashinfer", "flashinfer_hnd", "mla", "packed", "crosslayer")

    def __init__(self, spec, rank):
        import torch

        self.torch = torch
        self.device = torch.device(spec["device"])
        self.layout = spec["layout"]
        self.L = spec["n_layers"] + (spec.get("window_layers", 0) if spec.get("window") else 0)
        self.bs = spec["block_size"]
        self.kbs = spec["kernel_block_size"] or self.bs
        self.ratio = self.bs // self.kbs
        self.KB = spec["n_blocks"] * self.ratio
        self.heads = 1 if spec["mla"] else spec["heads_total"] // spec["tp"]
        self.head0 = 0 if spec["mla"] else rank * self.heads
        self.d = spec["head_dim"]
        self.dtype = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32,
                      "fp8": torch.uint8}[spec["dtype"]]
        self.esize = torch.empty((), dtype=self.dtype).element_size()
        self.int_dtype = {1: torch.uint8, 2: torch.int16, 4: torch.int32}[self.esize]
        KB, kbs, h, d, L = self.KB, self.kbs, self.heads, self.d, self.L
        self.cross = None
        if self.layout == "crosslayer":
            self.cross = torch.empty((KB, L, 2, kbs, h, d), dtype=self.dtype, device=self.device)
            logical = self.cross.permute(1, 2, 0, 3, 4, 5)
            self.layers = [logical[i] for i in range(L)]
        else:
            self.layers = [self._alloc() for _ in range(L)]
        fill = {1: 0x5A, 2: 0x5A5A, 4: 0x5A5A5A5A}[self.esize]
        for t in ([self.cross] if self.cross is not None else self.layers):
            t.view(self.int_dtype).fill_(fill)
        if spec.get("window"):  # vLLM's null block holds zeros
            for layer in range(self.L):
                for view in self.kv_views(layer):
                    view[0:self.ratio].fill_(0)

    def _alloc(self):
        KB, kbs, h, d = self.KB, self.kbs, self.heads, self.d
        lay = self.layout

        def empty(*shape):
            return self.torch.empty(shape, dtype=self.dtype, device=self.device)

        if lay == "nhd":
            return empty(2, KB, kbs, h, d)
        if lay == "hnd":
            return empty(2, KB, h, kbs, d).permute(0, 1, 3, 2, 4)
        if lay == "flashinfer":
            return empty(KB, 2, kbs, h, d)
        if lay == "flashinfer_hnd":
            return empty(KB, 2, h, kbs, d).permute(0, 1, 3, 2, 4)
        if lay == "mla":
            return empty(KB, kbs, d)
        if lay == "packed":
            return empty(KB, h, kbs, 2 * d)
        raise ValueError(f"unknown layout {lay}")

    def kv_views(self, layer, as_ints=True):
        """(K, V) (or (K,) for MLA) as (kernel blocks, kernel block, heads, head) views: of the
        elements' bits as integers, or (as_ints False) of the elements themselves."""
        t = self.layers[layer]
        t = t.view(self.int_dtype) if as_ints else t
        lay, d = self.layout, self.d
        if lay in ("nhd", "hnd", "crosslayer"):
            return t[0], t[1]
        if lay in ("flashinfer", "flashinfer_hnd"):
            return t[:, 0], t[:, 1]
        if lay == "mla":
            return (t.unsqueeze(2),)
        if lay == "packed":
            return t[..., :d].permute(0, 2, 1, 3), t[..., d:].permute(0, 2, 1, 3)
        raise ValueError(lay)

    def _slots(self, block_ids, start, end):
        torch = self.torch
        kb, off = [], []
        for p in range(start, end):
            b = block_ids[p // self.bs]
            kb.append(b * self.ratio + (p % self.bs) // self.kbs)
            off.append(p % self.kbs)
        return (torch.tensor(kb, dtype=torch.long, device=self.device),
                torch.tensor(off, dtype=torch.long, device=self.device))

    def values(self, codes, layer, kv):
        """The KV the model writes for positions with these prefix codes: (n, heads, head) ints."""
        torch = self.torch
        c = torch.tensor(codes, dtype=torch.int64).view(-1, 1, 1)
        heads = torch.arange(self.head0, self.head0 + self.heads, dtype=torch.int64).view(1, -1, 1)
        dims = torch.arange(self.d, dtype=torch.int64).view(1, 1, -1)
        x = (c * 48271 + (layer * 2 + kv + 1) * 16807 + heads * 69621 + dims * 40692) % _P
        x = (x * 48271) % _P
        x = (x * 69621 + 12345) % _P
        if self.esize == 1:
            x = (x & 0xFF).to(torch.uint8)
        elif self.esize == 2:
            x = ((x >> 3) & 0xFFFF).sub(32768).to(torch.int16)
        else:
            x = ((x << 1) ^ (x >> 11)).bitwise_and(0xFFFFFFFF).sub(2 ** 31).to(torch.int32)
        return x.to(self.device)

    def block_is_zero(self, block):
        return all(bool((view[block * self.ratio:(block + 1) * self.ratio] == 0).all())
                   for layer in range(self.L) for view in self.kv_views(layer))

    def write(self, layer, tokens, block_ids, start, end, skip_null=False):
        if skip_null:
            while start < end and block_ids[start // self.bs] == 0:
                start += 1
        if end <= start:
            return
        codes = prefix_codes(tokens[:end])[start:end]
        kb, off = self._slots(block_ids, start, end)
        for kv, view in enumerate(self.kv_views(layer)):
            view[kb, off] = self.values(codes, layer, kv)

    def check(self, tokens, block_ids, start, end, layers=None):
        """Mismatches between the pages and what the model writes: [(layer, kv, first position)]."""
        bad = []
        if end <= start:
            return bad
        codes = prefix_codes(tokens[:end])[start:end]
        kb, off = self._slots(block_ids, start, end)
        for layer in (range(self.L) if layers is None else layers):
            for kv, view in enumerate(self.kv_views(layer)):
                got = view[kb, off]
                want = self.values(codes, layer, kv)
                if not self.torch.equal(got, want):
                    rows = (got != want).flatten(1).any(1).nonzero().flatten().tolist()
                    bad.append((layer, kv, start + rows[0]))
        return bad

    def row_bytes(self, tokens, layer, position):
        """The bytes of one token's K row (all heads) of a layer, as a stored object holds them."""
        codes = prefix_codes(tokens[:position + 1])[position:position + 1]
        v = self.values(codes, layer, 0).cpu()
        return bytes(v.contiguous().view(self.torch.uint8).flatten().tolist())


# --- the worker process --------------------------------------------------------------------------------


@dataclass
class _WorkerRequest:
    tokens: list
    block_ids: list
    num_computed: int
    n_prompt: int
    wblock_ids: list = None


class WorkerRunner:
    """One tensor-parallel rank: the WORKER-role connector, the paged cache, the tiny model."""

    def __init__(self, spec, rank):
        from kvstrata import vllm as kv

        self.spec = spec
        self.rank = rank
        self.vocab = spec["vocab"]
        self.kcc = make_kv_cache_config(spec)
        self.conn = kv.KvstrataConnector(make_vllm_config(spec, rank), kv.KVConnectorRole.WORKER,
                                         self.kcc)
        self.cache = PagedCache(spec, rank)
        self.llama = None
        if spec["model"] == "llama":
            import torch

            from kvs_llama import TinyLlama

            if spec["tp"] != 1 or spec["mla"]:
                raise ValueError("the Llama model runs with one rank and K/V pages")
            h, d = spec["heads_total"], spec["head_dim"]
            dims = dict(vocab=spec["vocab"], hidden=4 * h * d, layers=spec["n_layers"],
                        q_heads=2 * h, kv_heads=h, head_dim=d, ffn=8 * h * d)
            self.llama = TinyLlama(torch, dims, self.cache.dtype, self.cache.device)
        self.logits = collections.defaultdict(list)  # rid -> [(first position, last row's logits)]
        self.names = layer_names(spec["n_layers"]) + window_layer_names(spec)
        self.n_full = spec["n_layers"]
        # KV-sharing layers (vLLM's kv_sharing_target_layer_name): the model's last layers read the
        # KV of its first ones; they are in no KV cache group, but register_kv_caches gets them
        # with their target's tensor and the layer hooks are called for them too.
        n_shared = spec.get("shared_layers", 0)
        self.shared = {f"model.layers.{spec['n_layers'] + i}.self_attn.attn": i
                       for i in range(n_shared)}
        if self.cache.cross is not None:
            self.conn.register_cross_layers_kv_cache(self.cache.cross, CrossLayerBackend)
        else:
            caches = dict(zip(self.names, self.cache.layers))
            caches.update({n: self.cache.layers[t] for n, t in self.shared.items()})
            self.conn.register_kv_caches(caches)
        self.reqs = {}

    def model_description(self):
        return self.conn._model.as_dict()

    def _update_states(self, so):
        for rid in so.finished_req_ids:
            self.reqs.pop(rid, None)
        for nr in so.scheduled_new_reqs:
            self.reqs[nr.req_id] = _WorkerRequest(
                list(nr.prompt_token_ids), list(nr.block_ids[0]), nr.num_computed_tokens,
                len(nr.prompt_token_ids), list(nr.block_ids[1]) if len(nr.block_ids) > 1 else None)
        c = so.scheduled_cached_reqs
        for i, rid in enumerate(c.req_ids):
            r = self.reqs.get(rid)
            if r is None:
                toks = list(c.all_token_ids[rid])
                r = self.reqs[rid] = _WorkerRequest(toks, [], 0, len(toks) - c.num_output_tokens[i])
            nb = c.new_block_ids[i]
            if rid in resumed_ids(c):
                r.block_ids = list(nb[0])
                r.wblock_ids = list(nb[1]) if len(nb) > 1 else None
            elif nb is not None:
                r.block_ids.extend(nb[0])
                if len(nb) > 1:
                    r.wblock_ids = (r.wblock_ids or []) + list(nb[1])
            if rid in c.all_token_ids:
                r.tokens = list(c.all_token_ids[rid])
            r.num_computed = c.num_computed_tokens[i]
            # a sample the scheduler discarded (its step's load failed) is dropped, as vLLM does
            del r.tokens[r.n_prompt + c.num_output_tokens[i]:]

    def execute(self, so, opts=None):
        """One step in vLLM's worker order. opts: order ('load_first': start_load_kv before the
        layers; 'layers_first': after them, as vLLM does when the step has no synchronous load;
        'v2': the V2 model runner's, where wait_for_save comes after sampling and drafting;
        'deferred_finalize': the V1 runner with a drafter (speculative decoding), which asks
        get_finished and get_block_ids_with_load_errors before the draft model runs and calls
        wait_for_save and clear_connector_metadata only after it), no_forward (run the step as
        vLLM's kv_connector_no_forward even with tokens scheduled), no_forward_wait_save (some
        releases called wait_for_save there too; main at 017e9f4448b7 does not, on either
        runner)."""
        opts = opts or {}
        conn, calls = self.conn, []
        self._update_states(so)
        meta = so.kv_connector_metadata
        conn.handle_preemptions(meta)
        calls.append("handle_preemptions")
        conn.bind_connector_metadata(meta)
        calls.append("bind_connector_metadata")
        sampled = {}
        if so.total_num_scheduled_tokens == 0 or opts.get("no_forward"):
            conn.start_load_kv(None)
            calls.append("start_load_kv")
            if opts.get("no_forward_wait_save"):
                conn.wait_for_save()
                calls.append("wait_for_save")
        else:
            order = opts.get("order", "load_first")
            if order in ("load_first", "v2", "deferred_finalize"):
                conn.start_load_kv(None)
                calls.append("start_load_kv")
            work = [(rid, self.reqs[rid], n) for rid, n in so.num_scheduled_tokens.items()]
            states = {}
            if self.llama is not None:
                states = {rid: self.llama.begin(r.tokens[r.num_computed:r.num_computed + n],
                                                r.num_computed) for rid, r, n in work}
            for layer, name in enumerate(self.names):
                conn.wait_for_layer_load(name)
                for rid, r, n in work:
                    if self.llama is not None:
                        self._llama_layer(layer, states[rid], r, n)
                    elif layer >= self.n_full:  # a sliding-window layer: its blocks only
                        self.cache.write(layer, r.tokens, r.wblock_ids, r.num_computed,
                                         r.num_computed + n, skip_null=True)
                    else:
                        self.cache.write(layer, r.tokens, r.block_ids, r.num_computed,
                                         r.num_computed + n)
                conn.save_kv_layer(name, self.cache.layers[layer], None)
            for name, target in self.shared.items():  # they only read their target's KV
                conn.wait_for_layer_load(name)
                conn.save_kv_layer(name, self.cache.layers[target], None)
            calls.append("layers")
            if order == "layers_first":
                conn.start_load_kv(None)
                calls.append("start_load_kv")
            if order in ("load_first", "layers_first"):
                conn.wait_for_save()
                calls.append("wait_for_save")
            for rid, r, n in work:
                last = None
                if self.llama is not None:
                    last = self.llama.finish(states[rid])[-1]
                    self.logits[rid].append((r.num_computed, last.cpu()))
                r.num_computed += n
                if r.num_computed >= len(r.tokens):
                    tok = sample(r.tokens, self.vocab) if last is None else int(last.argmax())
                    r.tokens.append(tok)
                    sampled[rid] = tok
            calls.append("sample")
            if order == "v2":
                calls.append("draft")
                conn.wait_for_save()
                calls.append("wait_for_save")
        deferred = opts.get("order") == "deferred_finalize" and "layers" in calls
        sending, recving = conn.get_finished(set(so.finished_req_ids))
        calls.append("get_finished")
        invalid = conn.get_block_ids_with_load_errors()
        calls.append("get_block_ids_with_load_errors")
        stats = conn.get_kv_connector_stats()
        if deferred:  # finalize_kv_connector, after the draft model's forward
            calls.append("draft")
            conn.wait_for_save()
            calls.append("wait_for_save")
        conn.clear_connector_metadata()
        calls.append("clear_connector_metadata")
        return WorkerOutput(self.rank, sampled, sending, recving, set(invalid), stats, calls)

    def check(self, tokens, block_ids, start, end):
        return self.cache.check(tokens, block_ids, start, end)

    def check_hybrid(self, tokens, block_ids, wblock_ids, start, end, wstart):
        """Full-attention layers over [start, end), sliding-window layers over [wstart, end) of
        their own table, and whether the null block (0) of every layer is still all zero."""
        full = self.cache.check(tokens, block_ids, start, end, range(self.n_full))
        window = self.cache.check(tokens, wblock_ids, wstart, end,
                                  range(self.n_full, self.cache.L))
        return full, window, self.cache.block_is_zero(0)

    # -- the Llama model (spec["model"] == "llama") --

    def _llama_layer(self, layer, state, r, n):
        """One layer of one request: the new tokens' K and V into its blocks, then attention over
        every position's K and V read from its blocks."""
        start = r.num_computed
        q, k, v = self.llama.qkv(layer, state)
        K, V = self.cache.kv_views(layer, as_ints=False)
        kb, off = self.cache._slots(r.block_ids, start, start + n)
        K[kb, off] = k
        V[kb, off] = v
        kb, off = self.cache._slots(r.block_ids, 0, start + n)
        self.llama.attend(layer, state, q, K[kb, off], V[kb, off])

    def llama_logits(self, rid):
        """[(first position of the step, logits of the step's last token)] of request rid."""
        return self.logits[rid]

    def llama_check_pages(self, saved_tokens, block_ids, n):
        """Layers whose pages (block_ids, positions < n) differ from the K/V that a pass over
        saved_tokens computes: what a restore put there against what was saved."""
        import torch

        with torch.inference_mode():
            _logits, kv = self.llama.dense(saved_tokens)
            kb, off = self.cache._slots(block_ids, 0, n)
            bad = []
            for layer in range(self.spec["n_layers"]):
                K, V = self.cache.kv_views(layer, as_ints=False)
                for which, page, want in ((0, K, kv[layer][0]), (1, V, kv[layer][1])):
                    if not torch.equal(page[kb, off], want[:n]):
                        bad.append((layer, which))
            return bad

    def llama_references(self, saved_tokens, n, tokens):
        """Logits of the last of `tokens` (CPU float32): "after_saved", its tail computed over
        the first n positions' K/V of a pass over saved_tokens (what an engine whose own cache
        still held them computes); "full", one pass over all of them; "hf", transformers' own
        forward (None without transformers)."""
        import torch

        with torch.inference_mode():
            _l, kv = self.llama.dense(saved_tokens)
            past = [(k[:n], v[:n]) for k, v in kv]
            after, _kv = self.llama.dense(tokens[n:], past)
            full, _kv = self.llama.dense(tokens)
            hf = self.llama.hf_logits(tokens)
        return {"after_saved": after[-1].cpu(), "full": full[-1].cpu(),
                "hf": None if hf is None else hf[-1].cpu(), "source": self.llama.source,
                "device": str(self.cache.device)}

    def row_bytes(self, tokens, layer, position):
        return self.cache.row_bytes(tokens, layer, position)

    def shutdown(self):
        self.conn.shutdown()


# --- processes ------------------------------------------------------------------------------------


class RemoteError(Exception):
    def __init__(self, type_name, message, tb):
        super().__init__(f"{type_name}: {message}\n--- in the child process ---\n{tb}")
        self.type_name = type_name
        self.message = message


def _actor_main(conn, module, cls_name, args):
    try:
        obj = getattr(importlib.import_module(module), cls_name)(*args)
        conn.send(("ok", None))
    except BaseException as e:  # noqa: BLE001 - reported to the driver
        conn.send(("err", (type(e).__name__, str(e), traceback.format_exc())))
        return
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            break
        if msg is None:
            try:
                obj.shutdown()
                conn.send(("ok", None))
            except BaseException as e:  # noqa: BLE001
                conn.send(("err", (type(e).__name__, str(e), traceback.format_exc())))
            break
        name, a, kw = msg
        try:
            conn.send(("ok", getattr(obj, name)(*a, **kw)))
        except BaseException as e:  # noqa: BLE001
            conn.send(("err", (type(e).__name__, str(e), traceback.format_exc())))


class Actor:
    """An object living in a spawned process; call() runs one of its methods there."""

    TIMEOUT = 180

    def __init__(self, cls, *args):
        ctx = multiprocessing.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_actor_main, args=(child, cls.__module__, cls.__name__, args),
                                daemon=True)
        self.proc.start()
        child.close()
        self._result(f"{cls.__name__}()")

    def _result(self, what):
        if not self.conn.poll(self.TIMEOUT):
            raise TimeoutError(f"{what}: no answer from the child process in {self.TIMEOUT} s")
        try:
            status, value = self.conn.recv()
        except EOFError:
            self.proc.join(10)
            raise RuntimeError(f"{what}: the child process exited (code {self.proc.exitcode})")
        if status == "err":
            raise RemoteError(*value)
        return value

    def send(self, name, *a, **kw):
        self.conn.send((name, a, kw))

    def result(self, name="call"):
        return self._result(name)

    def call(self, name, *a, **kw):
        self.send(name, *a, **kw)
        return self._result(name)

    def close(self):
        if self.proc.is_alive():
            try:
                self.conn.send(None)
                if self.conn.poll(60):
                    self.conn.recv()
            except (OSError, EOFError):
                pass
            self.proc.join(30)
        if self.proc.is_alive():
            self.proc.terminate()
            self.proc.join(10)


# --- the driver ---------------------------------------------------------------------------------------


def object_bytes(spec):
    """Bytes of one stored chunk object (connector/object.c: header page + layers) for a rank."""
    heads = 1 if spec["mla"] else spec["heads_total"] // spec["tp"]
    esize = {"fp16": 2, "bf16": 2, "fp32": 4, "fp8": 1}[spec["dtype"]]
    kv = 1 if spec["mla"] else 2
    layer = kv * spec["chunk_tokens"] * heads * spec["head_dim"] * esize
    header = 72 + 8 * spec["n_layers"]
    return -(-header // 4096) * 4096 + spec["n_layers"] * layer


class Harness:
    """A vLLM instance in miniature: one scheduler process, one worker process per TP rank."""

    def __init__(self, test, layout="nhd", dtype="fp16", tp=1, n_layers=2, heads_total=2,
                 head_dim=16, block_size=16, kernel_block_size=None, n_blocks=96, chunk_tokens=32,
                 capacity="64MiB", yaml_extra="", default_config=False, extra_config=None,
                 token_budget=1024, vocab=32000, loads=None, model="hash", device=None,
                 tiers_below="", shared_layers=0, kv_role="kv_both", shm_name=None, window=None,
                 window_layers=2, async_scheduling=False):
        """kv_role: vLLM's (kv_producer, kv_consumer, kv_both). shm_name: the DRAM tier's shared
        memory object (default one of this instance's own): two instances given the same one share
        the tier, as a prefill and a decode instance do. async_scheduling: vLLM's engine core with
        async scheduling (one step in flight): step() schedules step k+1 before the scheduler gets
        step k's output (see SchedulerRunner)."""
        self.tmp = tempfile.mkdtemp(prefix="kvs-pytest-")
        test.addCleanup(shutil.rmtree, self.tmp, True)
        self.engine_id = "t" + uuid.uuid4().hex[:16]
        self.shm_name = shm_name or "kvstrata-" + self.engine_id
        extra = dict(extra_config or {})
        mla = layout == "mla"
        spec = dict(layout=layout, dtype=dtype, tp=tp, n_layers=n_layers,
                    heads_total=1 if mla else heads_total, head_dim=head_dim, block_size=block_size,
                    kernel_block_size=kernel_block_size, n_blocks=n_blocks,
                    chunk_tokens=chunk_tokens, vocab=vocab, token_budget=token_budget, mla=mla,
                    model_id="kvstrata-test/tiny", engine_id=self.engine_id,
                    model_dtype="float16" if dtype == "fp8" else
                    {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32"}[dtype],
                    cache_dtype="fp8" if dtype == "fp8" else "auto", model=model,
                    device=device or test_device(), shared_layers=shared_layers,
                    kv_role=kv_role, window=window, window_layers=window_layers if window else 0,
                    async_scheduling=bool(async_scheduling))
        if default_config:
            extra.setdefault("dram_capacity", capacity)
        elif "config" in extra:
            pass  # the caller's YAML file, as it is
        else:
            text = (f"version: 1\nchunk_tokens: {chunk_tokens}\n"
                    + (f"loads:\n  async: {loads}\n" if loads else "")
                    + yaml_extra
                    + f"tiers:\n  - name: dram\n    type: dram\n    capacity: {capacity}\n"
                    + ("    write: through\n" if tiers_below else "")
                    + f"    options:\n      shm_name: {self.shm_name}\n" + tiers_below)
            path = os.path.join(self.tmp, "kvstrata.yaml")
            with open(path, "w") as f:
                f.write(text)
            extra["config"] = path
        spec["extra_config"] = extra
        self.spec = spec
        self.tp = tp
        self.actors = []
        test.addCleanup(self.close)
        self.sched = self._spawn(SchedulerRunner, spec)
        self.workers = [self._spawn(WorkerRunner, spec, r) for r in range(tp)]
        self.pending_recving = collections.Counter()
        self.pending_sending = collections.Counter()
        self.steps = []
        self.async_scheduling = bool(async_scheduling)
        self.pending = None  # async scheduling: the output of the step in flight, not fed back yet

    def _spawn(self, cls, *args):
        a = Actor(cls, *args)
        self.actors.append(a)
        return a

    def close(self):
        for a in reversed(self.actors):
            a.close()
        self.actors = []
        leftover = os.path.join("/dev/shm", self.shm_name)
        if os.path.exists(leftover):
            os.unlink(leftover)

    # -- driving --

    def add(self, rid, prompt, max_tokens=2, lora=False, cache_salt=None, mm=(),
            kv_transfer_params=None):
        self.sched.call("add_request", rid, list(prompt), max_tokens, lora, cache_salt, list(mm),
                        kv_transfer_params)

    def step(self, opts=None, worker_order=None, per_rank_opts=None, between=None):
        """One engine step; returns (scheduler output, [worker outputs], what went back).
        between(): called after the scheduler built the step, before the workers run it (what
        vLLM's engine core may do meanwhile with async scheduling, e.g. abort a request).
        With async_scheduling the scheduler builds this step while the previous one is still in
        flight: the workers run the steps in order, the previous step's output goes back to the
        scheduler after this step was scheduled, and this step's output stays in flight (what went
        back is what will; flush() feeds it)."""
        so = self.sched.call("schedule")
        if between is not None:
            between()
        outs = [None] * self.tp
        order = list(worker_order) if worker_order is not None else list(range(self.tp))
        if worker_order is None:
            for r in order:
                self.workers[r].send("execute", so, (per_rank_opts or {}).get(r, opts))
            for r in order:
                outs[r] = self.workers[r].result("execute")
        else:
            for r in order:  # one rank after the other, in this order
                outs[r] = self.workers[r].call("execute", so, (per_rank_opts or {}).get(r, opts))
        recving, sending = set(), set()
        for o in outs:
            for rid in o.finished_recving or ():
                self.pending_recving[rid] += 1
                if self.pending_recving[rid] == self.tp:
                    recving.add(rid)
                    del self.pending_recving[rid]
            for rid in o.finished_sending or ():
                self.pending_sending[rid] += 1
                if self.pending_sending[rid] == self.tp:
                    sending.add(rid)
                    del self.pending_sending[rid]
        invalid = set().union(*(o.invalid_block_ids for o in outs))
        back = StepOutput(outs[0].sampled, sending, recving, invalid)
        if self.async_scheduling:
            self.flush()
            self.pending = back
        else:
            self.sched.call("update_from_output", back)
        self.steps.append((so, outs, back))
        return so, outs, back

    def flush(self):
        """Async scheduling: the step in flight's output goes back to the scheduler now."""
        if self.pending is not None:
            back, self.pending = self.pending, None
            self.sched.call("update_from_output", back)

    def run(self, until, max_steps=200, **kw):
        for _ in range(max_steps):
            if until():
                return
            self.step(**kw)
        raise AssertionError(f"not done after {max_steps} steps")

    def info(self, rid):
        return self.sched.call("info", rid)

    def check(self, rid, start=0, end=None):
        """Every rank's pages of request rid hold the model's KV for tokens [start, end)."""
        i = self.info(rid)
        # (async scheduling: the positions in flight have no token yet)
        end = min(i["num_computed"], len(i["tokens"])) if end is None else end
        return {r: w.call("check", i["tokens"], i["block_ids"], start, end)
                for r, w in enumerate(self.workers)}

    def check_hybrid(self, rid, n):
        """A hybrid model's request rid over its first n tokens on every rank: (full-attention
        mismatches over [0, n), sliding-window ones over [s(n), n), null block still zero)."""
        i = self.info(rid)
        return {r: w.call("check_hybrid", i["tokens"], i["block_ids"], i["window_block_ids"], 0,
                          n, first_held(self.spec, n))
                for r, w in enumerate(self.workers)}

    def probe(self, rid, tokens, num_computed):
        return self.sched.call("probe_lookup", rid, list(tokens), num_computed)


class Node:
    """A kvstrata-node (build/bin, beside the library KVSTRATA_LIBRARY names) on 127.0.0.1 serving
    objects up to 1 MiB, for the remote tier; stopped by the test's cleanup. tiers: the node's
    `tiers:` entries (YAML, indented two spaces; default a 64 MiB DRAM tier), or config: the whole
    YAML (the command line's listen address and psk file win over its `node:` section); "{dir}"
    in either becomes the node's own folder, which holds the folders ssd0 and ssd1. kill() and start() stop it with SIGKILL and start it
    again on the same port, with the same tiers and folder."""

    def __init__(self, test, tiers=None, config=None):
        lib = os.environ.get("KVSTRATA_LIBRARY", "")
        binary = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(lib))), "bin",
                              "kvstrata-node")
        if not os.access(binary, os.X_OK):
            raise unittest.SkipTest(f"no kvstrata-node at {binary} (build it: make build)")
        self.dir = tempfile.mkdtemp(prefix="kvs-node-")
        test.addCleanup(shutil.rmtree, self.dir, True)
        for d in ("ssd0", "ssd1"):  # for the ssd tiers `tiers` may name
            os.mkdir(os.path.join(self.dir, d))
        self.psk = os.path.join(self.dir, "node.key")
        with open(os.open(self.psk, os.O_WRONLY | os.O_CREAT, 0o600), "wb") as f:
            f.write(bytes((i * 7 + 3) & 0xFF for i in range(32)))
        self.config = os.path.join(self.dir, "node.yaml")
        tiers = tiers or "  - name: dram\n    type: dram\n    capacity: 64MiB\n"
        text = config or "version: 1\nlog_level: error\ntiers:\n" + tiers
        with open(self.config, "w") as f:
            f.write(text.replace("{dir}", self.dir))
        self.binary = binary
        self.whole_config = config is not None
        self.address = "127.0.0.1:0"
        self.proc = None
        test.addCleanup(self.stop)
        self.start()

    def start(self):
        import subprocess

        size = [] if self.whole_config else ["--max-object-bytes", "1MiB"]
        self.proc = subprocess.Popen([self.binary, "--config", self.config, "--psk-file", self.psk,
                                      "--listen", self.address] + size,
                                     stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        if not line.startswith("kvstrata-node ready listen="):
            raise RuntimeError(f"kvstrata-node did not start: {line!r}")
        self.address = line.split("listen=")[1].split()[0]

    def kill(self):
        """SIGKILL, as an owner that crashes: nothing of it is closed cleanly."""
        self.proc.kill()
        self.proc.wait()
        self.proc.stdout.close()

    def tenant_key(self, tenant):
        """The path of `tenant`'s key file, derived from the node's master key by
        `kvstrata-node --tenant-key` (made once): what that tenant's clients give as psk_file."""
        import subprocess

        path = os.path.join(self.dir, f"{tenant}.key")
        if not os.path.exists(path):
            subprocess.run([self.binary, "--psk-file", self.psk, "--tenant-key", tenant,
                            "--out", path], check=True)
        return path

    def tier(self, tenant, timeout_ms=1000):
        """The YAML of a remote tier `far` over this node, with the tenant's own key."""
        return (f"  - name: far\n    type: remote\n    nodes: [{self.address}]\n    options:\n"
                f"      psk_file: {self.tenant_key(tenant)}\n      tenant: {tenant}\n"
                f"      timeout_ms: {timeout_ms}\n")

    def stop(self):
        """SIGTERM; returns the node's final stats line as a dict (None when it had stopped)."""
        if self.proc is None or self.proc.stdout.closed:
            return None
        stats = None
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                out, _ = self.proc.communicate(timeout=10)
                last = [ln for ln in out.splitlines() if ln.startswith("kvstrata-node stopped")]
                if last:
                    stats = dict(kv.split("=", 1) for kv in last[-1].split() if "=" in kv)
            except Exception:  # noqa: BLE001 - killed below
                self.proc.kill()
                self.proc.wait()
        if not self.proc.stdout.closed:
            self.proc.stdout.close()
        return stats


def prompt(seed, n, vocab=32000):
    """A deterministic prompt of n tokens."""
    return [(seed * 7919 + i * 104729 + (i * i) % 977) % vocab for i in range(n)]


def corrupt_shared_object(shm_name, needle):
    """Flip one byte of the first stored object whose payload holds `needle` (bytes written by the
    model for one token) in the DRAM tier's shared memory object; returns the offset or None."""
    path = os.path.join("/dev/shm", shm_name)
    with open(path, "r+b") as f:
        data = f.read()
        at = data.find(needle)
        if at < 0:
            return None
        f.seek(at)
        f.write(bytes([data[at] ^ 0xFF]))
    return at


def asdict(obj):
    return dataclasses.asdict(obj)
