# Names and signatures only: stand-ins for the vLLM classes kvstrata.vllm derives from, used when vLLM is not installed.
"""The few vLLM names KvstrataConnector needs, with the method signatures of vLLM's
vllm/distributed/kv_transfer/kv_connector/v1/base.py and .../v1/metrics.py and of
vllm/v1/metrics/utils.py, read on vLLM's main branch at upstream commit 017e9f4448b7 (2026-08-17). The
bodies do the least the connector relies on (the base class keeps the config and the bound metadata);
nothing here is vLLM's code. When vLLM is importable, kvstrata.vllm uses the real classes instead and
this module is never imported."""

import enum
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any


class KVConnectorRole(enum.Enum):
    SCHEDULER = 0
    WORKER = 1


class KVConnectorMetadata(ABC):  # noqa: B024 - vLLM's is an ABC with no abstract method too
    pass


class KVConnectorHandshakeMetadata(ABC):  # noqa: B024
    pass


class KVConnectorWorkerMetadata(ABC):
    @abstractmethod
    def aggregate(self, other):
        ...


class SupportsHMA(ABC):
    @abstractmethod
    def request_finished_all_groups(self, request, block_ids):
        ...


def supports_hma(connector):
    if isinstance(connector, type):
        return issubclass(connector, SupportsHMA)
    return isinstance(connector, SupportsHMA)


class KVConnectorBase_V1(ABC):
    @property
    def supports_divergent_local_hybrid_hits(self):
        return False

    @property
    def prefer_cross_layer_blocks(self):
        return False

    @property
    def requires_kv_delivery(self):
        return bool(getattr(self._kv_transfer_config, "is_kv_producer", False))

    def __init__(self, vllm_config, role, kv_cache_config):
        self._connector_metadata = None
        self._vllm_config = vllm_config
        if getattr(vllm_config, "kv_transfer_config", None) is None:
            raise ValueError("kv_transfer_config must be set for KVConnectorBase_V1")
        self._kv_transfer_config = vllm_config.kv_transfer_config
        self._kv_cache_config = kv_cache_config
        self._role = role

    @property
    def role(self):
        return self._role

    # worker side

    def bind_connector_metadata(self, connector_metadata):
        self._connector_metadata = connector_metadata

    def clear_connector_metadata(self):
        self._connector_metadata = None

    def _get_connector_metadata(self):
        assert self._connector_metadata is not None
        return self._connector_metadata

    def has_connector_metadata(self):
        return self._connector_metadata is not None

    def register_kv_caches(self, kv_caches):
        return

    def register_cross_layers_kv_cache(self, kv_cache, attn_backend):
        return

    def set_host_xfer_buffer_ops(self, copy_operation):
        return

    def handle_preemptions(self, kv_connector_metadata):
        return

    @abstractmethod
    def start_load_kv(self, forward_context, **kwargs):
        ...

    @abstractmethod
    def wait_for_layer_load(self, layer_name):
        ...

    @abstractmethod
    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        ...

    @abstractmethod
    def wait_for_save(self):
        ...

    def get_finished(self, finished_req_ids):
        return None, None

    def get_block_ids_with_load_errors(self):
        return set()

    def shutdown(self):
        return None

    def get_kv_connector_stats(self):
        return None

    def get_kv_connector_kv_cache_events(self):
        return None

    def get_handshake_metadata(self):
        return None

    def build_connector_worker_meta(self):
        return None

    # scheduler side

    def bind_gpu_block_pool(self, gpu_block_pool):
        return

    @abstractmethod
    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        ...

    @abstractmethod
    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        ...

    @abstractmethod
    def build_connector_meta(self, scheduler_output):
        ...

    def on_new_request(self, request):
        return

    def update_connector_output(self, connector_output):
        return

    def request_finished(self, request, block_ids):
        return False, None

    def take_events(self):
        return ()

    def has_pending_push_work(self):
        return False

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config):
        return None

    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config):
        return False

    def get_finished_count(self):
        return None

    @classmethod
    def build_kv_connector_stats(cls, data=None):
        return None

    def set_xfer_handshake_metadata(self, metadata):
        return None

    def set_xfer_handshake_metadata_pp_aware(self, metadata):
        return None

    @classmethod
    def build_prom_metrics(cls, vllm_config, metric_types, labelnames, per_engine_labelvalues):
        return None

    def reset_cache(self):
        return None


@dataclass
class KVConnectorStats:
    data: dict[str, Any] = field(default_factory=dict)

    def reset(self):
        raise NotImplementedError

    def aggregate(self, other):
        raise NotImplementedError

    def reduce(self):
        raise NotImplementedError

    def is_empty(self):
        raise NotImplementedError


def _metric_class(metric_types, name):
    """vLLM keys metric_types by prometheus_client's classes; find one by its class name so that
    nothing here imports prometheus_client."""
    for key, value in metric_types.items():
        if getattr(key, "__name__", None) == name:
            return value
    raise KeyError(f"metric_types has no {name}")


class KVConnectorPromMetrics:
    def __init__(self, vllm_config, metric_types, labelnames, per_engine_labelvalues):
        self._kv_transfer_config = vllm_config.kv_transfer_config
        self._gauge_cls = _metric_class(metric_types, "Gauge")
        self._counter_cls = _metric_class(metric_types, "Counter")
        self._histogram_cls = _metric_class(metric_types, "Histogram")
        self._labelnames = labelnames
        self.per_engine_labelvalues = per_engine_labelvalues

    def observe(self, transfer_stats_data, engine_idx=0):
        raise NotImplementedError


def create_metric_per_engine(metric, per_engine_labelvalues):  # vllm/v1/metrics/utils.py
    return {idx: metric.labels(*values) for idx, values in per_engine_labelvalues.items()}
