# Names and signatures only: stand-ins for the TensorRT-LLM classes kvstrata.trtllm derives from, used when TensorRT-LLM is not installed.
"""The TensorRT-LLM names the kvstrata connector needs, with the signatures of
tensorrt_llm/_torch/pyexecutor/connectors/kv_cache_connector.py (KvCacheConnectorScheduler,
KvCacheConnectorWorker, RequestData, SchedulerOutput) read on TensorRT-LLM's main branch at upstream
commit 035ab91cad04b7b77a479a9526edecfbc742c661 (its date is not in the index it was read from; the
file's copyright line reads 2022-2026). The bodies do the least the connector relies on (the base
classes keep the LLM arguments and the bound metadata; the per-layer-group forms fold one group into
the flat form); nothing here is TensorRT-LLM's code. When TensorRT-LLM is importable, kvstrata.trtllm
uses the real classes instead and this module is never imported."""

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import List, Optional, Tuple


@dataclass
class RequestData:
    request_id: int
    new_tokens: List[int]
    new_block_ids: List[int]
    computed_position: int
    num_scheduled_tokens: int
    block_hashes: List[int] = field(default_factory=list)
    priorities: Optional[List[int]] = None
    cache_salt: Optional[str] = None
    new_block_ids_by_layer_group: List[List[int]] = field(default_factory=list)


@dataclass
class SchedulerOutput:
    new_requests: List[RequestData] = field(default_factory=list)
    cached_requests: List[RequestData] = field(default_factory=list)
    attention_dp_rank: Optional[int] = None


class KvCacheConnectorWorker(ABC):
    supports_attention_dp: bool = False

    def __init__(self, llm_args):
        self._llm_args = llm_args
        self._metadata = None

    def bind_connector_meta(self, metadata: object):
        self._metadata = metadata

    def get_connector_meta(self) -> object:
        return self._metadata

    def _clear_connector_meta(self):
        self._metadata = None

    def register_forward_pass_callable(self):
        return None

    @abstractmethod
    def register_kv_caches(self, kv_cache_tensor):
        ...

    def register_kv_cache_layout(self, layout) -> None:
        raise NotImplementedError("the stand-in describes no KvCacheLayout")

    @abstractmethod
    def start_load_kv(self, stream):
        ...

    @abstractmethod
    def wait_for_layer_load(self, layer_idx: int, stream):
        ...

    @abstractmethod
    def save_kv_layer(self, layer_idx: int, stream):
        ...

    @abstractmethod
    def wait_for_save(self, stream):
        ...

    @abstractmethod
    def get_finished(self, finished_gen_req_ids: List[int],
                     started_loading_req_ids: List[int]) -> Tuple[List[int], List[int]]:
        ...


class KvCacheConnectorScheduler(ABC):
    supports_attention_dp: bool = False

    def __init__(self, llm_args):
        self._llm_args = llm_args

    @abstractmethod
    def build_connector_meta(self, scheduler_output: SchedulerOutput):
        ...

    @abstractmethod
    def get_num_new_matched_tokens(self, request, num_computed_tokens: int) -> Tuple[int, bool]:
        ...

    @abstractmethod
    def request_finished(self, request, cache_block_ids: List[int]) -> bool:
        ...

    def request_finished_by_layer_group(self, request,
                                        cache_block_ids_by_layer_group: List[List[int]]) -> bool:
        if len(cache_block_ids_by_layer_group) != 1:
            raise NotImplementedError("several layer groups")
        return self.request_finished(request, cache_block_ids_by_layer_group[0])

    @abstractmethod
    def update_state_after_alloc(self, request, block_ids: List[int]):
        ...

    def update_state_after_alloc_by_layer_group(self, request,
                                                block_ids_by_layer_group: List[List[int]]) -> None:
        if len(block_ids_by_layer_group) != 1:
            raise NotImplementedError("several layer groups")
        self.update_state_after_alloc(request, block_ids_by_layer_group[0])

    def wait_for_initialization(self):
        return None
