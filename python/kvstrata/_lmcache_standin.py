# Names and signatures only: stand-ins for the LMCache classes kvstrata.lmcache derives from or receives, used when LMCache is not installed.
"""The LMCache names kvstrata.lmcache needs, with the method signatures of LMCache's main branch as
read in its files (the commit each was read at; the code index gave no commit dates, the pull
requests around them date from 2026-03 to 2026-09):

- lmcache/v1/storage_backend/connector/base_connector.py at 01712fbd51d0: RemoteConnector
- lmcache/v1/storage_backend/connector/__init__.py at 0109660ce57f: ConnectorAdapter,
  ConnectorContext
- lmcache/v1/storage_backend/connector/fs_connector.py at 0219539f5266 and mock_connector.py at
  1af20e9375a4: what a connector calls on the MemoryObj and the LocalCPUBackend it receives
- csrc/storage_backends/connector_interface.h at 8a72c30fbf7b and connector_pybind_utils.h at
  a4ef094e2e20: the native connector client (NativeConnectorClient below) that
  lmcache/v1/distributed/l2_adapters/native_plugin_l2_adapter.py at 68c638a6a8e8 loads and
  native_connector_l2_adapter.py at 0b43a45563fe drives

The bodies do the least the adapters and their tests rely on; nothing here is LMCache's code. When
LMCache is importable, kvstrata.lmcache uses the real classes and this module is never imported.
"""

import abc
from typing import List, Optional


class CacheEngineKey:
    """The key LMCache's storage backends pass a connector (lmcache/utils.py); a connector uses
    only to_string()."""

    def __init__(self, model_name, world_size, worker_id, chunk_hash, dtype):
        self.model_name = model_name
        self.world_size = world_size
        self.worker_id = worker_id
        self.chunk_hash = chunk_hash
        self.dtype = dtype

    def to_string(self):
        return "@".join(str(v) for v in (self.model_name, self.world_size, self.worker_id,
                                          self.chunk_hash, self.dtype))


class MemoryObj(abc.ABC):
    """A chunk in LMCache's host memory (lmcache/v1/memory_management.py)."""

    @property
    @abc.abstractmethod
    def byte_array(self):
        ...

    @abc.abstractmethod
    def get_size(self):
        ...

    @abc.abstractmethod
    def get_shape(self):
        ...

    @abc.abstractmethod
    def get_dtype(self):
        ...

    @abc.abstractmethod
    def get_memory_format(self):
        ...

    @abc.abstractmethod
    def ref_count_down(self):
        ...


class LocalCPUBackend(abc.ABC):
    """The allocator a connector fills on a get (lmcache/v1/storage_backend/local_cpu_backend.py)."""

    @abc.abstractmethod
    def allocate(self, shape, dtype, fmt=None):
        ...


class RemoteConnector(metaclass=abc.ABCMeta):
    @abc.abstractmethod
    async def exists(self, key: CacheEngineKey) -> bool:
        ...

    @abc.abstractmethod
    def exists_sync(self, key: CacheEngineKey) -> bool:
        ...

    @abc.abstractmethod
    async def get(self, key: CacheEngineKey) -> Optional[MemoryObj]:
        ...

    @abc.abstractmethod
    async def put(self, key: CacheEngineKey, memory_obj: MemoryObj):
        ...

    @abc.abstractmethod
    async def list(self) -> List[str]:
        ...

    @abc.abstractmethod
    async def close(self):
        ...

    def post_init(self):
        pass

    def support_ping(self) -> bool:
        return False

    async def ping(self) -> int:
        raise NotImplementedError

    def support_batched_get(self) -> bool:
        return False

    async def batched_get(self, keys: List[CacheEngineKey]) -> List[Optional[MemoryObj]]:
        raise NotImplementedError

    def support_batched_put(self) -> bool:
        return False

    async def batched_put(self, keys: List[CacheEngineKey], memory_objs: List[MemoryObj]):
        raise NotImplementedError

    def support_batched_async_contains(self) -> bool:
        return False

    async def batched_async_contains(self, lookup_id: str, keys: List[CacheEngineKey],
                                     pin: bool = False) -> int:
        raise NotImplementedError

    def support_batched_get_non_blocking(self) -> bool:
        return False

    async def batched_get_non_blocking(self, lookup_id: str,
                                       keys: List[CacheEngineKey]) -> List[MemoryObj]:
        raise NotImplementedError

    def remove_sync(self, key: CacheEngineKey) -> bool:
        raise NotImplementedError

    def batched_contains(self, keys: List[CacheEngineKey],
                         stop_after_first_not_exits: bool = True) -> List[bool]:
        raise NotImplementedError

    def support_batched_contains(self) -> bool:
        return False


class ConnectorContext:
    def __init__(self, url, loop, local_cpu_backend, config, metadata, plugin_name=None):
        self.url = url
        self.loop = loop
        self.local_cpu_backend = local_cpu_backend
        self.config = config
        self.metadata = metadata
        self.plugin_name = plugin_name


class ConnectorAdapter(abc.ABC):
    def __init__(self, schema: str = "") -> None:
        self.schema = schema

    def can_parse(self, url: str) -> bool:
        return self.schema != "" and url.startswith(self.schema)

    @abc.abstractmethod
    def create_connector(self, context: ConnectorContext) -> RemoteConnector:
        ...


class NativeConnectorClient(abc.ABC):
    """What LMCache's multi-process mode calls on a native plugin (its pybind binding's names)."""

    @abc.abstractmethod
    def event_fd(self):
        ...

    @abc.abstractmethod
    def submit_batch_get(self, keys, memoryviews):
        ...

    @abc.abstractmethod
    def submit_batch_set(self, keys, memoryviews):
        ...

    @abc.abstractmethod
    def submit_batch_exists(self, keys):
        ...

    @abc.abstractmethod
    def submit_batch_delete(self, keys):
        ...

    @abc.abstractmethod
    def drain_completions(self):
        ...

    @abc.abstractmethod
    def close(self):
        ...
