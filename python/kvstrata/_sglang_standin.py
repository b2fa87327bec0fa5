# Names and signatures only: stand-ins for the SGLang HiCache storage classes kvstrata.sglang derives from, used when SGLang is not installed.
"""The SGLang names KvstrataHiCacheStorage needs: HiCacheStorageConfig, HiCacheStorageExtraInfo
and the abstract HiCacheStorage, with the fields and method signatures of SGLang's
python/sglang/srt/mem_cache/hicache_storage.py, read on SGLang's main branch at upstream commit
001067fffe33 (001067fffe33427bee0ed2f007fb7551a1d76b44), read on 2026-12-02 through a code index
that gives no commit date. The bodies do nothing SGLang's do beyond keeping the host pool;
nothing here is SGLang's code. When SGLang is importable, kvstrata.sglang uses the real classes
instead and this module is never imported."""

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, List, Optional


@dataclass
class HiCacheStorageConfig:
    tp_rank: int
    tp_size: int
    pp_rank: int
    pp_size: int
    attn_cp_rank: int
    attn_cp_size: int
    is_mla_model: bool
    enable_storage_metrics: bool
    is_page_first_layout: bool
    model_name: Optional[str]
    dp_rank: int = 0
    dp_size: int = 1
    tp_lcm_size: Optional[int] = None
    should_split_heads: bool = False
    extra_config: Optional[dict] = None


@dataclass
class HiCacheStorageExtraInfo:
    prefix_keys: Optional[List[str]] = None
    extra_info: Optional[dict] = None


class HiCacheStorage(ABC):
    def register_mem_pool_host(self, mem_pool_host):
        self.mem_pool_host = mem_pool_host

    def register_mem_host_pool_v2(self, host_pool, host_pool_name):
        raise NotImplementedError

    def batch_exists_v2(self, keys: List[str], pool_transfers: Optional[list] = None,
                        extra_info: Optional[HiCacheStorageExtraInfo] = None):
        raise NotImplementedError

    def batch_get_v2(self, transfers: list,
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> dict:
        raise NotImplementedError

    def batch_set_v2(self, transfers: list,
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> dict:
        raise NotImplementedError

    def batch_get_v1(self, keys: List[str], host_indices: Any,
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> List[bool]:
        raise NotImplementedError

    def batch_set_v1(self, keys: List[str], host_indices: Any,
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> List[bool]:
        raise NotImplementedError

    @abstractmethod
    def get(self, key: str, target_location: Optional[Any] = None,
            target_sizes: Optional[Any] = None):
        ...

    @abstractmethod
    def batch_get(self, keys: List[str], target_locations: Optional[Any] = None,
                  target_sizes: Optional[Any] = None):
        ...

    @abstractmethod
    def set(self, key: str, value: Optional[Any] = None, target_location: Optional[Any] = None,
            target_sizes: Optional[Any] = None) -> bool:
        ...

    @abstractmethod
    def batch_set(self, keys: List[str], values: Optional[Any] = None,
                  target_locations: Optional[Any] = None,
                  target_sizes: Optional[Any] = None) -> bool:
        ...

    @abstractmethod
    def exists(self, key: str) -> bool:
        ...

    def batch_exists(self, keys: List[str],
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> int:
        raise NotImplementedError

    def clear(self) -> None:
        return None

    def get_stats(self):
        return None
