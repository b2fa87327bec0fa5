"""The worker-side hooks of KvstrataConnector (kvstrata.vllm): the KV cache tensors each worker
registers, the step's metadata it binds, the loads and saves around the forward pass and what
get_finished reports. A mixin: the state it uses is made by KvstrataConnector.__init__."""

from kvstrata import _abi
from kvstrata.vllm_base import KvstrataConnectorMetadata
from kvstrata.vllm_model import KvstrataConfigError, _shape, _strides, layer_view


class WorkerHooks:
    """vLLM's worker-side connector hooks (role WORKER)."""

    def register_kv_caches(self, kv_caches):
        # Layers that share another layer's KV (vLLM's kv_sharing_target_layer_name) are in no KV
        # cache group but come with their target's tensor: they are the target's layer here,
        # stored and loaded once, and their hooks are the target's (a save is gathered by the
        # target's hook only). Layers a group names are layers of their own even when their
        # tensors alias another's memory (vLLM's hybrid allocator shares one buffer among groups).
        grouped = set()
        group_of = {}
        for gi, g in enumerate(getattr(self._kv_cache_config, "kv_cache_groups", None) or ()):
            grouped.update(g.layer_names)
            group_of.update((n, gi) for n in g.layer_names)
        layers, index, owner = [], {}, {}
        pending = []
        for name, t in kv_caches.items():
            ident = (int(t.data_ptr()), _shape(t), _strides(t), str(t.device))
            if grouped and name not in grouped:
                pending.append((name, ident))
                continue
            if not grouped and ident in owner:
                pending.append((name, ident))
                continue
            owner.setdefault(ident, len(layers))
            index[name] = len(layers)
            layers.append((name, t))
        for name, ident in pending:
            if ident not in owner:
                raise KvstrataConfigError(
                    f"kvstrata: layer {name!r} is in no KV cache group and its tensor is no other "
                    "layer's: it is neither an attention layer kvstrata stores nor one sharing "
                    "another layer's KV")
            index[name] = owner[ident]
            self._shared_layers.add(name)
        if len(getattr(self, "_handles", ())) > 1:
            self._register_groups(layers, index, group_of)
            return
        self._register(layers, index)

    def _register_groups(self, layers, index, group_of):
        """A hybrid model: each group's handle registers that group's layers (in vLLM's order);
        a layer name maps to (group, index in its group)."""
        per_group = [[] for _ in self._groups]
        where = {}
        for i, (name, t) in enumerate(layers):
            g = group_of[name]
            where[i] = (g, len(per_group[g]))
            per_group[g].append((name, t))
        views = []
        for g, (h, desc) in enumerate(zip(self._handles, self._models)):
            if len(per_group[g]) != desc.n_layers:
                raise KvstrataConfigError(
                    f"kvstrata: vLLM registered {len(per_group[g])} layers of KV cache group {g}, "
                    f"but its description (from kv_cache_config) has {desc.n_layers}")
            v = [layer_view(name, t, desc) for name, t in per_group[g]]
            h.register_kv(v)
            views += v
        self._cuda = any(v.device_kind == _abi.DEVICE_CUDA for v in views)
        self._kv_tensors = [t for _n, t in layers]  # the pages must outlive the handles
        self._layer_names = [n for n, _t in layers]
        self._layer_index = {name: where[i] for name, i in index.items()}

    def register_cross_layers_kv_cache(self, kv_cache, attn_backend):
        try:
            order = tuple(attn_backend.get_kv_cache_stride_order(include_num_layers_dimension=True))
        except (AttributeError, NotImplementedError, TypeError):
            order = tuple(range(kv_cache.dim()))
        if sorted(order) != list(range(kv_cache.dim())):
            raise KvstrataConfigError(
                f"kvstrata: the attention backend's stride order {order} does not fit the "
                f"cross-layer KV cache of shape {tuple(kv_cache.shape)}")
        logical = kv_cache.permute(*[order.index(i) for i in range(len(order))])
        names = self._cross_layer_names(int(logical.shape[0]))
        index = {}
        for i, group in enumerate(names):
            for n in group:
                index[n] = i
        self._register([(group[0], logical[i]) for i, group in enumerate(names)], index)

    def _cross_layer_names(self, n_layers):
        kcc = self._kv_cache_config
        tensors = getattr(kcc, "kv_cache_tensors", None) if kcc else None
        if tensors and len(tensors) == n_layers:
            return [list(t.shared_by) for t in tensors]
        groups = getattr(kcc, "kv_cache_groups", None) if kcc else None
        if groups and len(groups[0].layer_names) == n_layers:
            return [[n] for n in groups[0].layer_names]
        raise KvstrataConfigError(
            f"kvstrata: the cross-layer KV cache holds {n_layers} layers, and the KV cache config "
            "names no layer list of that length")

    def _register(self, layers, index):
        desc = self._model
        if len(layers) != desc.n_layers:
            raise KvstrataConfigError(
                f"kvstrata: vLLM registered {len(layers)} KV cache layers, but the model "
                f"description (from vllm_config) has {desc.n_layers}")
        views = [layer_view(name, t, desc) for name, t in layers]
        self._cuda = any(v.device_kind == _abi.DEVICE_CUDA for v in views)
        self._handle.register_kv(views)
        self._kv_tensors = [t for _n, t in layers]  # the pages must outlive the handle
        self._layer_names = [n for n, _t in layers]
        self._layer_index = dict(index)

    def _layer(self, layer_name):
        """(handle, layer index in its handle) of a registered layer."""
        try:
            at = self._layer_index[layer_name]
            if isinstance(at, tuple):
                return self._handles[at[0]], at[1]
            return self._handle, at
        except KeyError:
            raise KvstrataConfigError(
                f"kvstrata: layer {layer_name!r} was not registered (register_kv_caches named "
                f"{len(self._layer_index)} layers)") from None

    def bind_connector_metadata(self, connector_metadata):
        super().bind_connector_metadata(connector_metadata)
        if self._kv_tensors is None or not isinstance(connector_metadata, KvstrataConnectorMetadata):
            return
        # A step still bound (no forward pass ran: no layer hooks, no wait_for_save) is closed by the
        # library here (ABI 1.5).
        blobs = getattr(connector_metadata, "blobs", None) or [connector_metadata.blob]
        if len(blobs) != len(self._handles):
            raise KvstrataConfigError(
                f"kvstrata: the step's metadata has {len(blobs)} blobs for {len(self._handles)} "
                "KV cache groups")
        for h, blob in zip(self._handles, blobs):
            h.bind_meta(blob)
        self._expect_sending.update(getattr(connector_metadata, "sending_groups", None) or {})
        self._bound = True
        self._started = False

    def clear_connector_metadata(self):
        super().clear_connector_metadata()
        self._started = False
        self._bound = False

    def handle_preemptions(self, kv_connector_metadata):
        # wait_for_save completes the gathers out of the pages (asynchronous saves only store from
        # the library's own buffers afterwards), so a preempted request's pages are never read
        # after its step: nothing to wait for.
        return None

    def _start(self):
        if self._started:
            return
        if self._cuda:
            import torch

            stream = torch.cuda.current_stream().cuda_stream
            for h in self._handles:
                h.set_stream(stream)
        for h in self._handles:
            h.start_load()
        self._started = True

    def start_load_kv(self, forward_context, **kwargs):
        if self._bound:
            self._start()

    def wait_for_layer_load(self, layer_name):
        if not self._bound:
            return
        h, layer = self._layer(layer_name)
        self._start()  # vLLM may run the layers first when the step has no synchronous load
        h.wait_layer_load(layer)

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        if not self._bound or layer_name in self._shared_layers:
            return
        h, layer = self._layer(layer_name)
        self._start()
        h.save_layer(layer)

    def wait_for_save(self):
        if not self._bound:
            return
        self._start()
        for h in self._handles:
            h.wait_save()

    def get_finished(self, finished_req_ids):
        if self._handle is None or self._kv_tensors is None:
            return None, None
        if len(self._handles) == 1:
            sending, receiving = self._handle.get_finished()
            return (set(sending) or None), (set(receiving) or None)
        # a request is finished when every group's handle that holds work of it reported it
        done_sending, done_recving = set(), set()
        n = len(self._handles)
        for h in self._handles:
            sending, receiving = h.get_finished()
            for rid in sending:
                c = self._pending_sending[rid] = self._pending_sending.get(rid, 0) + 1
                if c >= self._expect_sending.get(rid, n):
                    done_sending.add(rid)
            for rid in receiving:
                c = self._pending_recving[rid] = self._pending_recving.get(rid, 0) + 1
                if c >= n:
                    done_recving.add(rid)
        for rid in done_sending:
            del self._pending_sending[rid]
            self._expect_sending.pop(rid, None)
        for rid in done_recving:
            del self._pending_recving[rid]
        return (done_sending or None), (done_recving or None)

    def get_block_ids_with_load_errors(self):
        if self._handle is None or self._kv_tensors is None:
            return set()
        out = set()
        for h in self._handles:  # vLLM's block ids are global across groups
            out.update(h.load_error_blocks())
        return out

