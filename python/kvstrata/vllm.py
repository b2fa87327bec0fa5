"""KvstrataConnector: vLLM's KV connector v1 over libkvstrata.

Enable it with
  --kv-transfer-config '{"kv_connector":"KvstrataConnector","kv_connector_module_path":"kvstrata.vllm",
    "kv_role":"kv_both","kv_load_failure_policy":"recompute",
    "kv_connector_extra_config":{"config":"deploy.yaml"}}'

vLLM builds one instance with role SCHEDULER in its engine-core process and one with role WORKER in
each worker process (one per tensor-parallel rank). Each opens its own libkvstrata handle in __init__;
importing this module and calling its class methods (what vLLM's front-end process does) never loads
the library. docs/vllm.md describes the configuration, the metrics and the process layout.
"""

import array
import atexit
import logging
import os
import shutil
import tempfile
import time
import weakref

from kvstrata import _abi

from kvstrata.vllm_base import (  # noqa: F401 - re-exported: the base classes in use
    HAVE_VLLM,
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    KvstrataConnectorMetadata,
    SupportsHMA,
)
from kvstrata.vllm_metrics import KvstrataConnectorStats, KvstrataPromMetrics, stats_delta
from kvstrata.vllm_worker import WorkerHooks

_log = logging.getLogger("kvstrata")

__all__ = [
    "KvstrataConnector",
    "KvstrataConnectorMetadata",
    "KvstrataConnectorStats",
    "KvstrataPromMetrics",
    "KvstrataConfigError",
    "ModelDescription",
    "describe_model",
    "layer_view",
]

MAX_TENANT_LABELS = 64  # tenants counted apart over the process's life; the rest count as "other"
# A consumer waits this long (kv_connector_extra_config 'handoff_wait_ms') for the chunks a
# producer said it stored before it takes the hit it has (the rest is recomputed).
DEFAULT_HANDOFF_WAIT_MS = 10000
# The key of request_finished's kv_transfer_params a producer fills: the tokens (whole chunks) its
# saves store for the request. vLLM hands the params to the decode request on the consumer.
STORED_TOKENS_PARAM = "kvstrata_stored_tokens"

_TRANSFER_ROLES = {None: _abi.TRANSFER_BOTH, "kv_both": _abi.TRANSFER_BOTH,
                   "kv_producer": _abi.TRANSFER_PRODUCER, "kv_consumer": _abi.TRANSFER_CONSUMER}


def transfer_role(kv_transfer_config):
    """The library's transfer role for vLLM's kv_role (kv_producer, kv_consumer, kv_both)."""
    kv_role = getattr(kv_transfer_config, "kv_role", None)
    try:
        return _TRANSFER_ROLES[kv_role]
    except KeyError:
        raise KvstrataConfigError(
            f"kvstrata: kv_role {kv_role!r} is not kv_producer, kv_consumer or kv_both") from None


from kvstrata.vllm_model import (  # noqa: E402 - re-exported: kvstrata.vllm names them
    DEFAULT_CHUNK_TOKENS,
    DEFAULT_DRAM_CAPACITY,
    KvstrataConfigError,
    ModelDescription,
    _DTYPE_BY_NAME,
    _dtype_name,
    _kvs_dtype,
    _tp_rank,
    BLOCK_NONE,
    KVGroup,
    _group_kind,
    kv_groups,
    describe_model,
    _TORCH_DTYPES,
    _shape,
    _strides,
    layer_view,
    _SHM_OK,
    _SIZE_OK,
    default_shm_name,
    default_config_text,
)


def _role_is_scheduler(role):
    if role == KVConnectorRole.SCHEDULER:
        return True
    return getattr(role, "name", None) == "SCHEDULER"


# --- metadata, stats, metrics ---------------------------------------------------------------------


# Handles still open at interpreter exit are closed (a shared tier is unlinked by its last user).
_open_connectors = weakref.WeakSet()


@atexit.register
def _close_open_connectors():
    for c in list(_open_connectors):
        try:
            c.shutdown()
        except Exception:
            pass


# --- the connector --------------------------------------------------------------------------------------


from kvstrata.vllm_request import (  # noqa: E402
    _NEVER,
    _SchedRequest,
    _bypass_reason,
    _text,
    key_inputs,
    tenant_label,
    _per_group,
    _set_tokens,
)


def _base_takes_kv_cache_config():
    """Whether the base class's constructor has the kv_cache_config parameter (releases before it
    took (vllm_config, role) only)."""
    import inspect

    try:
        params = inspect.signature(KVConnectorBase_V1.__init__).parameters
    except (TypeError, ValueError):
        return True
    return "kv_cache_config" in params or len(params) >= 4 or any(
        p.kind == p.VAR_POSITIONAL for p in params.values())


# SupportsHMA: vLLM keeps its hybrid allocator on for models with several KV cache groups
# (full-attention and sliding-window layers); kvstrata stores each group through a handle of its own.
class KvstrataConnector(WorkerHooks, KVConnectorBase_V1, SupportsHMA):
    """vLLM KV connector v1 over libkvstrata (docs/vllm.md)."""

    _transfer_role = _abi.TRANSFER_BOTH  # kv_role (set in __init__)
    _handoff_wait_s = DEFAULT_HANDOFF_WAIT_MS / 1000.0
    _chunk_tokens = 0  # the library's, from the first lookup (ABI 1.10)
    _groups = ()  # KVGroup per KV cache group, one handle each (set in __init__)
    _windows = ()
    _handles = ()

    @property
    def _n_groups(self):
        return max(1, len(self._groups))

    def __init__(self, vllm_config, role, kv_cache_config=None):
        if _base_takes_kv_cache_config():
            super().__init__(vllm_config, role, kv_cache_config)
        else:  # vLLM releases whose base class took (vllm_config, role)
            super().__init__(vllm_config, role)
        self._scheduler = _role_is_scheduler(role)
        ktc = vllm_config.kv_transfer_config
        self._extra = dict(getattr(ktc, "kv_connector_extra_config", None) or {})
        self._transfer_role = transfer_role(ktc)
        self._handoff_wait_s = float(self._extra.get("handoff_wait_ms",
                                                     DEFAULT_HANDOFF_WAIT_MS)) / 1000.0
        self._chunk_tokens = 0  # the library's, from the first lookup (ABI 1.10)
        self._groups = kv_groups(vllm_config, kv_cache_config)
        self._models = [describe_model(vllm_config, kv_cache_config, scheduler=self._scheduler,
                                       group=g.index) for g in self._groups]
        self._model = self._models[0]
        self._windows = [g for g in self._groups if g.window]
        self._tmpdir = None
        self._handle = None
        self._handles = []
        self._kept_groups = {}  # scheduler: finished request -> groups whose handle keeps its pages
        self._expect_sending = {}  # worker: request -> groups that report its saves
        self._pending_sending = {}
        self._pending_recving = {}
        # scheduler side
        self._requests = {}
        # build_meta_update: the requests a step may hand over (every other one is parked: it
        # decodes past its prompt and the library's copy of it is no longer followed)
        self._watch = set()
        self._epoch = None  # reset_cache's random value, in every later request's keys
        self._resets = 0
        self._tenants = {}  # tenant label -> lookup counts since the last stats call
        self._tenant_labels = set()  # every label counted so far (at most MAX_TENANT_LABELS)
        # worker side
        self._layer_index = {}
        self._shared_layers = set()
        self._layer_names = []
        self._kv_tensors = None
        self._cuda = False
        self._bound = False
        self._started = False
        self._last_stats = None
        self._last_raw_stats = None
        self._tier_names = []
        self._config_path = self._resolve_config()
        try:
            self._open()
        except BaseException:
            for h in self._handles:
                h.close()
            self._handles, self._handle = [], None
            if self._tmpdir:
                shutil.rmtree(self._tmpdir, ignore_errors=True)
            raise

    # -- setup --

    def _resolve_config(self):
        path = self._extra.get("config")
        if path:
            path = os.path.abspath(os.path.expanduser(str(path)))
            if not os.path.isfile(path):
                raise KvstrataConfigError(
                    f"kvstrata: kv_connector_extra_config 'config' names {path}, which is not a "
                    "file")
            return path
        text = default_config_text(self._vllm_config, self._extra, self._model.block_tokens)
        self._tmpdir = tempfile.mkdtemp(prefix="kvstrata-vllm-")
        path = os.path.join(self._tmpdir, "kvstrata.yaml")
        with open(path, "w") as f:
            f.write(text)
        return path

    def _open(self):
        _abi.require_minor(5, "KvstrataConnector")
        role = _abi.ROLE_SCHEDULER if self._scheduler else _abi.ROLE_WORKER
        for model in self._models:  # one handle per KV cache group
            self._handles.append(_abi.Handle(role, model.as_dict(), self._config_path,
                                             transfer_role=self._transfer_role))
        self._handle = self._handles[0]
        self._tier_names = self._handle.tier_names()
        self._key_inputs_supported = (hasattr(self._handle, "request_key_input")
                                      and _abi.has_hook("request_key_input"))
        self._meta_updates = (self._scheduler and hasattr(self._handle, "build_meta_update")
                              and _abi.has_hook("build_meta_update"))
        info = self._handle.info() if hasattr(self._handle, "info") and _abi.has_hook(
            "handle_info") else None
        # without the library's word, decode tokens may be saved: every request goes every step
        self._decode_saves = True if info is None else bool(info["save_decode"])
        _open_connectors.add(self)

    # -- properties and class methods (no library) --

    @property
    def prefer_cross_layer_blocks(self):
        v = self._extra.get("cross_layer_blocks", False)
        return v is True or str(v).lower() in ("1", "true", "yes", "on")

    @property
    def requires_kv_delivery(self):
        # A producer's hand-off must reach its consumer: vLLM recomputes a request preempted while
        # it is pending. Elsewhere a dropped save costs a later miss, never correctness.
        return self._transfer_role == _abi.TRANSFER_PRODUCER

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config):
        return None  # every layout is read through its strides

    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config):
        return True  # the layer hooks must run between the graph's pieces

    @classmethod
    def build_kv_connector_stats(cls, data=None):
        return KvstrataConnectorStats(data=dict(data) if data else {})

    @classmethod
    def build_prom_metrics(cls, vllm_config, metric_types, labelnames, per_engine_labelvalues):
        return KvstrataPromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)

    # -- scheduler side --

    def _track(self, request):
        rid = request.request_id
        st = self._requests.get(rid)
        if st is None:
            st = self._requests[rid] = _SchedRequest(request, _bypass_reason(request), self._n_groups)
            st.tenant = tenant_label(request)
        else:
            st.request = request
        return st

    def _key(self, rid, st, source):
        """Give the library the request's key inputs once, before its keys are first computed. A
        library without request_key_input (ABI < 1.10) cannot key them: such a request bypasses
        the connector rather than share the KV of requests without them."""
        if st.keyed or st.bypass:
            return
        st.keyed = True
        try:
            inputs = key_inputs(source, self._epoch) if source is not None else (
                [(0, b"epoch\0" + self._epoch)] if self._epoch else [])
            if inputs and not self._key_inputs_supported:
                st.bypass = "per-request key inputs (cache_salt, LoRA, multimodal) need ABI 1.10"
                return
            for h in self._handles:
                for first, data in inputs:
                    h.request_key_input(rid, first, data)
        except (KvstrataConfigError, _abi.KvsError) as e:
            # A request whose inputs cannot be keyed (too many images, an input without a hash) is
            # computed without the connector; the engine and the other requests go on.
            st.bypass = f"its key inputs were refused: {e}"
            _log.warning("kvstrata: request %r bypasses the connector: %s", rid, st.bypass)

    def on_new_request(self, request):
        self._track(request)

    def reset_cache(self):
        """vLLM's reset_prefix_cache(reset_connector=True) (a weight update, sleep and wake): every
        chunk stored so far becomes unreachable to this instance's later requests. The epoch, the
        count of resets, enters the keys of every request keyed from now on (instances that reset
        together, once per weight update, agree on it and keep sharing); a request the library
        already keyed with the old epoch (running, preempted or looked up while waiting) bypasses
        the connector from now on, so nothing computed with the old weights is stored under the
        new keys and nothing stored before is loaded. The stored objects age out of the tiers.
        False when the library cannot key requests (ABI < 1.10)."""
        if not self._scheduler:
            return None
        if not self._key_inputs_supported:
            return False
        self._resets += 1
        self._epoch = b"%d" % self._resets
        for st in self._requests.values():
            if (st.keyed or st.looked_up) and not st.bypass:
                st.bypass = "it was keyed before a cache reset"
                st.skip_from = 0
        return True

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        st = self._track(request)
        self._key(request.request_id, st, request)
        if st.bypass:
            return 0, False
        _set_tokens(st, request.all_token_ids)
        if len(self._handles) > 1:
            hit, load_async = self._lookup_groups(request.request_id, st, int(num_computed_tokens))
        else:
            res = self._handle.lookup(request.request_id, st.tokens, num_computed_tokens)
            if res.chunk_tokens:
                self._chunk_tokens = res.chunk_tokens
            hit = None if res.unknown_yet else res.hit_tokens
            load_async = res.load_async
        st.sent = len(st.tokens)  # a lookup gives the library the request's tokens
        st.looked_up = True
        st.async_armed = False
        st.lookup_computed = int(num_computed_tokens)
        if hit is None:
            return None, False
        if self._transfer_role == _abi.TRANSFER_CONSUMER and self._handoff_pending(
                request, st, num_computed_tokens + hit):
            return None, False
        self._count_tenant(st.tenant, hit,
                           max(0, len(st.tokens) - int(num_computed_tokens) - hit))
        st.load_async = bool(load_async and hit > 0)
        return hit, st.load_async

    # A hit a sliding-window group cannot cover is retried this many times, a chunk shorter each.
    _WINDOW_RETRIES = 4

    def _lookup_groups(self, rid, st, n_computed):
        """A hybrid model's hit (tokens, load_async), or (None, False) while a lookup is unknown
        yet: N tokens are a hit when every full-attention group holds [n_computed, N) and every
        sliding-window group the tokens its window needs before N, [max(n_computed, s(N)), N)
        (the blocks before s(N) are vLLM's null block). st.group_from gets where each group's
        load starts."""
        froms = [n_computed] * len(self._groups)
        end, asyncs = None, set()
        for g in self._groups:
            if g.window:
                continue
            res = self._handles[g.index].lookup(rid, st.tokens, n_computed)
            if res.chunk_tokens:
                self._chunk_tokens = res.chunk_tokens
            if res.unknown_yet:
                return None, False
            got = n_computed + res.hit_tokens
            end = got if end is None else min(end, got)
            if res.hit_tokens:
                asyncs.add(bool(res.load_async))
        if end is None:  # sliding-window groups only: what the first of them holds from n_computed
            end = len(st.tokens) - 1
        chunk = self._chunk_tokens or 1
        tries = self._WINDOW_RETRIES
        if end <= n_computed:  # no hit: the window groups' handles still get the tokens
            for g in self._windows:
                if self._handles[g.index].lookup(rid, st.tokens, n_computed).unknown_yet:
                    return None, False
        while end > n_computed:
            short = False
            for g in self._windows:
                froms[g.index] = max(n_computed, g.first_held(end))
                res = self._handles[g.index].lookup(rid, st.tokens, froms[g.index])
                if res.unknown_yet:
                    return None, False
                if froms[g.index] + res.hit_tokens < end:
                    short = froms[g.index] + res.hit_tokens
                    break
                asyncs.add(bool(res.load_async))
            if short is False:
                break
            tries -= 1
            # the window group holds chunks up to `short` at best: a shorter hit ends there
            shorter = min(end - 1, short) // chunk * chunk
            end = shorter if tries > 0 and shorter > n_computed else n_computed
        st.group_from = froms
        if end <= n_computed or len(asyncs) > 1:  # no hit, or groups that disagree on async
            return 0, False
        return end - n_computed, asyncs == {True}

    def _handoff_pending(self, request, st, found):
        """A consumer's request whose producer said it stored more than the tiers hold yet: True
        (ask again next step) until they do or the hand-off wait runs out; then the hit found is
        taken and the engine recomputes the rest (a miss, never wrong KV)."""
        params = getattr(request, "kv_transfer_params", None) or {}
        try:
            want = int(params.get(STORED_TOKENS_PARAM) or 0)
        except (TypeError, ValueError, AttributeError):
            return False
        # a hit ends on a chunk boundary and leaves the prompt's last token to the engine
        want = min(want, len(st.tokens) - 1)
        if self._chunk_tokens:
            want -= want % self._chunk_tokens
        if want <= 0 or found >= want:
            return False
        now = time.monotonic()
        if st.handoff_deadline is None:
            st.handoff_deadline = now + self._handoff_wait_s
        return now < st.handoff_deadline

    def _count_tenant(self, tenant, hit, miss):
        if tenant not in self._tenant_labels:
            # the Prometheus children live as long as the process: a bounded set of labels
            if len(self._tenant_labels) < MAX_TENANT_LABELS:
                self._tenant_labels.add(tenant)
            else:
                tenant = "other"
        t = self._tenants.get(tenant)
        if t is None:
            t = self._tenants[tenant] = {"lookups": 0, "hit_tokens": 0, "miss_tokens": 0}
        t["lookups"] += 1
        t["hit_tokens"] += hit
        t["miss_tokens"] += miss

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        st = self._track(request)
        if st.bypass:
            return
        self._set_tables(st, blocks.get_block_ids() if blocks is not None else None)
        if num_external_tokens == 0 and (not st.looked_up or st.async_armed):
            # Never looked up, or the second call vLLM makes when a request whose load ran
            # asynchronously is scheduled again (its KV is in the pages): not a cancel. The
            # library releases that load's lease when the request computes again.
            st.async_armed = False
            return
        end = st.lookup_computed + int(num_external_tokens)
        for g, h in zip(self._groups, self._handles):
            # a sliding-window group loads from the first token its window needs (group_from)
            n = 0
            if num_external_tokens:
                n = end - (st.group_from[g.index] if st.group_from else st.lookup_computed)
            try:
                h.on_alloc(request.request_id, st.tables[g.index], n)
            except _abi.NotFound:
                if n:
                    raise
        st.async_armed = bool(num_external_tokens and st.load_async)
        st.load_pending = bool(num_external_tokens)
        if st.load_pending:
            st.skip_from = _NEVER  # the next step carries its load
            self._watch.add(request.request_id)

    def _set_tables(self, st, block_ids):
        """st's block tables become vLLM's (block ids per group); a sliding-window group's null
        blocks (id 0) become BLOCK_NONE."""
        tables = _per_group(block_ids, self._n_groups) or [[] for _ in self._groups]
        for g in self._windows:
            tables[g.index] = [BLOCK_NONE if b == 0 else b for b in tables[g.index]]
        st.tables = tables
        st.sent_tables = [0] * len(tables)
        st.marked = [0] * len(tables)
        st.parked = st.past_prompt = False

    def _extend_tables(self, st, new_block_ids):
        new = _per_group(new_block_ids, self._n_groups)
        if not new:
            return
        for g, ids in enumerate(new):
            if ids:
                st.tables[g].extend(ids)
        for g in self._windows:
            t = st.tables[g.index]
            for i in range(len(t) - len(new[g.index]), len(t)):
                if t[i] == 0:
                    t[i] = BLOCK_NONE

    def _mark_window(self, st, n_computed):
        """vLLM frees a sliding-window group's blocks out of the window as the request computes
        (and does not say so in the scheduler output): they become BLOCK_NONE here, so the library
        saves no chunk over them. Marks at least what vLLM freed (it frees on fewer tokens)."""
        for g in self._windows:
            t = st.tables[g.index]
            upto = min(len(t), g.first_held(n_computed) // g.block_tokens)
            first = st.marked[g.index]
            if upto <= first:
                continue
            for i in range(first, upto):
                t[i] = BLOCK_NONE
            st.marked[g.index] = upto
            st.sent_tables[g.index] = min(st.sent_tables[g.index], first)

    def _new_request(self, nr):
        """A request vLLM schedules for the first time (or again after a preemption, in releases
        that list those as new): its state with the tokens and block tables nr gives, or None when
        it bypasses the connector."""
        st = self._requests.get(nr.req_id)
        if st is None:
            st = self._requests[nr.req_id] = _SchedRequest(None, _bypass_reason(nr),
                                                           self._n_groups)
        self._key(nr.req_id, st, st.request if st.request is not None else nr)
        if st.bypass:
            return None
        if st.request is not None:
            _set_tokens(st, st.request.all_token_ids)
        elif nr.prompt_token_ids is not None:
            _set_tokens(st, nr.prompt_token_ids)
        if st.prompt_tokens is None and nr.prompt_token_ids is not None:
            st.prompt_tokens = len(nr.prompt_token_ids)
        self._set_tables(st, nr.block_ids)
        self._mark_window(st, nr.num_computed_tokens)
        return st

    def build_connector_meta(self, scheduler_output):
        if self._meta_updates:
            return self._build_connector_meta_update(scheduler_output)
        steps = []
        num_scheduled = scheduler_output.num_scheduled_tokens
        for nr in scheduler_output.scheduled_new_reqs:
            st = self._new_request(nr)
            if st is None:
                continue
            steps.append(self._step(nr.req_id, st, nr.num_computed_tokens,
                                    num_scheduled.get(nr.req_id, 0)))
        cached = scheduler_output.scheduled_cached_reqs
        resumed = self._resumed_ids(cached)
        all_tokens = getattr(cached, "all_token_ids", None) or {}
        new_token_ids = getattr(cached, "new_token_ids", None) or []
        for i, rid in enumerate(cached.req_ids):
            st = self._requests.get(rid)
            if st is None:
                if rid not in all_tokens:
                    continue  # never seen and no tokens given: nothing to save or load
                st = self._requests[rid] = _SchedRequest(None, None, self._n_groups)
            self._key(rid, st, st.request)
            if st.bypass:
                continue
            nb = cached.new_block_ids[i] if i < len(cached.new_block_ids) else None
            if rid in resumed:
                self._set_tables(st, nb)
            elif nb:
                self._extend_tables(st, nb)
            self._mark_window(st, cached.num_computed_tokens[i])
            if rid in all_tokens:
                st.tokens = array.array("i", all_tokens[rid])
            elif st.request is not None:
                _set_tokens(st, st.request.all_token_ids)
            elif i < len(new_token_ids) and new_token_ids[i]:
                st.tokens.extend(new_token_ids[i])
            steps.append(self._step(rid, st, cached.num_computed_tokens[i], num_scheduled.get(rid, 0)))
        blobs = [h.build_meta([s[g] for s in steps]) for g, h in enumerate(self._handles)]
        return self._metadata(blobs, [s[0].req_id for s in steps])

    def _metadata(self, blobs, req_ids):
        kept, self._kept_groups = self._kept_groups, {}
        return KvstrataConnectorMetadata(blobs[0], req_ids, blobs=blobs, sending_groups=kept)

    def _build_connector_meta_update(self, so):
        """build_connector_meta over ABI 1.10's build_meta_update: each request's tokens and block
        table live in the library, so a step hands over only what changed, and a request that can
        neither load nor save in the step (decoding past its prompt, no load armed, decode tokens
        not saved) is not handed over at all: the step's cost does not grow with context."""
        updates = []
        num_scheduled = so.num_scheduled_tokens
        requests = self._requests
        for nr in so.scheduled_new_reqs:
            rid = nr.req_id
            st = self._new_request(nr)
            if st is None:
                continue
            updates.append(self._update(rid, st, nr.num_computed_tokens, num_scheduled.get(rid, 0)))
            self._after_update(rid, st)
        cached = so.scheduled_cached_reqs
        resumed = self._resumed_ids(cached)
        all_tokens = getattr(cached, "all_token_ids", None) or {}
        new_token_ids = getattr(cached, "new_token_ids", None) or []
        watch = self._watch
        # Only the requests that may load or save in this step are visited: those being watched
        # (prefilling, a load armed, decode tokens saved), resumed ones (vLLM gives their whole
        # table) and those vLLM gives every token of. A parked request (decoding past its prompt)
        # costs nothing per step: its table is not followed, so a step without loads or saves
        # costs nothing per decoding request, at any context length.
        for i in self._positions(cached.req_ids, watch, resumed, all_tokens):
            rid = cached.req_ids[i]
            nb = cached.new_block_ids[i] if i < len(cached.new_block_ids) else None
            n_computed = cached.num_computed_tokens[i]
            st = requests.get(rid)
            if st is not None and n_computed >= st.skip_from and rid not in resumed:
                # Bypassed, or decoding: nothing of it can load or save from now on. Parked only
                # on the second step seen so: with async scheduling this step was built before
                # the output of the last one, whose failed loads vLLM rewinds into the prompt
                # (the request, or one holding the same blocks, must then save what it
                # recomputes), so until then its table is still followed.
                if st.bypass or st.past_prompt:
                    watch.discard(rid)
                    st.parked = True
                    continue
                st.past_prompt = True
            elif st is not None:
                st.past_prompt = False
            if st is None:
                if rid not in all_tokens:
                    watch.discard(rid)
                    continue  # never seen and no tokens given: nothing to save or load
                st = requests[rid] = _SchedRequest(None, None, self._n_groups)
                self._key(rid, st, None)
            if st.bypass:
                st.skip_from = 0
                watch.discard(rid)
                continue
            if st.parked and not (rid in resumed
                                  and (rid in all_tokens or st.request is not None)):
                # below its prompt again without a whole table or token list: what the library
                # holds of it cannot be brought up to date, so it is computed without kvstrata
                st.bypass = "vLLM moved it back into its prompt without resuming it"
                _log.warning("kvstrata: request %r bypasses the connector: %s", rid, st.bypass)
                watch.discard(rid)
                continue
            if rid in resumed:
                self._set_tables(st, nb)
            elif nb:
                self._extend_tables(st, nb)
            if self._windows:
                self._mark_window(st, n_computed)
            if rid in all_tokens:
                _set_tokens(st, all_tokens[rid])
            elif st.request is not None:
                _set_tokens(st, st.request.all_token_ids)
            elif i < len(new_token_ids) and new_token_ids[i]:
                st.tokens.extend(new_token_ids[i])
            updates.append(self._update(rid, st, n_computed, num_scheduled.get(rid, 0)))
            self._after_update(rid, st)
        try:
            blobs = [h.build_meta_update([u[g] for u in updates])
                     for g, h in enumerate(self._handles)]
        except Exception:
            # what the library holds is unknown now: the next step hands these requests over whole
            for u in updates:
                st = requests.get(u[0].req_id)
                if st is not None:
                    st.sent = 0
                    st.sent_tables = [0] * len(st.tables)
            raise
        return self._metadata(blobs, [u[0].req_id for u in updates])

    @staticmethod
    def _update(rid, st, n_computed, n_scheduled):
        """The request's update for each group's handle (tokens alike, block tables per group)."""
        n_tokens = len(st.tokens)
        n_computed = min(int(n_computed), n_tokens)
        n_scheduled = max(0, min(int(n_scheduled), n_tokens - n_computed))
        sent = min(st.sent, n_tokens)
        tokens = st.tokens[sent:]
        out = []
        for g, table in enumerate(st.tables):
            sent_blocks = min(st.sent_tables[g], len(table))
            out.append(_abi.StepUpdate(rid, sent, tokens, sent_blocks,
                                       array.array("I", table[sent_blocks:]), n_computed,
                                       n_scheduled))
            st.sent_tables[g] = len(table)
        st.sent = n_tokens
        st.load_pending = False
        return out

    def _after_update(self, rid, st):
        """From which n_computed on the request need not be handed over: past its prompt when
        decode tokens are not saved (it can then neither load nor save until vLLM preempts it or
        rolls it back below that). Until a step shows it there, it is watched."""
        st.skip_from = (st.prompt_tokens if not self._decode_saves and st.prompt_tokens is not None
                        else _NEVER)
        self._watch.add(rid)

    @staticmethod
    def _positions(req_ids, watch, resumed, all_tokens):
        """The indices in req_ids of the requests in watch, resumed or all_tokens, in order."""
        if not (watch or resumed or all_tokens):
            return ()
        n = len(req_ids)
        if len(watch) + len(resumed) + len(all_tokens) >= n:
            return [i for i, rid in enumerate(req_ids)
                    if rid in watch or rid in resumed or rid in all_tokens]
        pos = dict(zip(req_ids, range(n)))
        found = {pos.get(rid) for group in (watch, resumed, all_tokens) for rid in group}
        found.discard(None)
        return sorted(found)

    @staticmethod
    def _resumed_ids(cached):
        resumed = getattr(cached, "resumed_req_ids", None)
        if resumed is not None:
            return resumed
        # releases before resumed_req_ids flag each cached request with resumed_from_preemption; a
        # resumed request's new_block_ids is its whole table, never an extension
        flags = getattr(cached, "resumed_from_preemption", None)
        if flags is None:
            raise KvstrataConfigError(
                "this vLLM's CachedRequestData has neither resumed_req_ids nor "
                "resumed_from_preemption: kvstrata cannot tell a resumed request's block table "
                "from an extension of it")
        return {rid for rid, flag in zip(cached.req_ids, flags) if flag}

    @staticmethod
    def _step(rid, st, n_computed, n_scheduled):
        n_tokens = len(st.tokens)
        # Tokens not known yet (async scheduling's placeholders, speculative drafts) are not saved.
        n_computed = min(int(n_computed), n_tokens)
        n_scheduled = max(0, min(int(n_scheduled), n_tokens - n_computed))
        return [_abi.StepSpec(rid, st.tokens, table, n_computed, n_scheduled)
                for table in st.tables]

    def request_finished(self, request, block_ids):
        st = self._requests.pop(request.request_id, None)
        self._watch.discard(request.request_id)
        if st is None or (st.bypass and not (st.keyed or st.looked_up)):
            return False, None  # (a request bypassed after the library saw it is still told)
        kept = known = 0
        for h in self._handles:
            try:
                kept += bool(h.request_finished(request.request_id))
                known += 1
            except _abi.NotFound:
                pass
        if not known:
            return False, None  # the library never saw it (finished before any lookup or step)
        keep = kept > 0
        if keep and len(self._handles) > 1:
            self._kept_groups[request.request_id] = kept
        params = None
        if self._transfer_role == _abi.TRANSFER_PRODUCER and self._chunk_tokens and not st.bypass:
            # what the saves store: the computed prompt, whole chunks (vLLM returns the params with
            # the request's output and a proxy hands them to the decode request)
            n = min(int(request.num_computed_tokens), int(request.num_prompt_tokens))
            params = {STORED_TOKENS_PARAM: n - n % self._chunk_tokens}
        return keep, params

    def request_finished_all_groups(self, request, block_ids):
        return self.request_finished(request, block_ids)

    def take_events(self):
        # kvstrata's events name chunk keys (hashes of whole prefixes, per model fingerprint), not
        # vLLM's block hashes, so a KV-event consumer could not match them: none are forwarded.
        return ()

    def get_kv_connector_stats(self):
        if self._handle is None:
            return None
        # vLLM's scheduler asks every step: a step that changed no counter costs one library call
        # per handle and a comparison of bytes
        structs = [h.stats_struct() for h in self._handles]
        raw = [bytes(s) for s in structs]
        if raw == self._last_raw_stats and not self._tenants:
            return None
        self._last_raw_stats = raw
        now = self._stats(structs)
        data = stats_delta(now, self._last_stats, self._tier_names,
                            with_tokens=self._scheduler or self._model.tp_rank == 0)
        self._last_stats = now
        if self._tenants:
            data["tenants"], self._tenants = self._tenants, {}
        stats = KvstrataConnectorStats(data=data)
        return None if stats.is_empty() else stats

    # Per-request counters (lookups, tokens, async loads, closed steps) are group 0's: every group's
    # handle counts the same requests. Chunks, bytes and times are summed over the groups.
    _GROUP_SUMMED = ("chunks_loaded", "bytes_loaded", "load_ns", "chunks_saved", "bytes_saved",
                     "save_ns", "saves_skipped", "load_errors", "evictions", "lossy_chunks_loaded",
                     "tier_chunks_loaded", "tier_bytes_loaded", "tier_load_ns")

    def _stats(self, structs):
        now = _abi.stats_dict(structs[0])
        for s in structs[1:]:
            more = _abi.stats_dict(s)
            for k in self._GROUP_SUMMED:
                if k not in now or k not in more:
                    continue
                if isinstance(now[k], list):
                    now[k] = [a + b for a, b in zip(now[k], more[k])]
                else:
                    now[k] += more[k]
        return now

    def shutdown(self):
        hs, self._handles = getattr(self, "_handles", None) or [], []
        h, self._handle = self._handle, None
        if h is not None and h not in hs:
            hs = [h] + hs
        for h in reversed(hs):
            h.close()
        _open_connectors.discard(self)
        if self._tmpdir:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
            self._tmpdir = None
