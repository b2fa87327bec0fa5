"""kvstrata: Python access to libkvstrata (a KV-cache connector with a C ABI).

kvstrata._abi is a ctypes binding of abi/kvstrata.h; kvstrata.vllm holds KvstrataConnector, vLLM's KV
connector v1 over it; kvstrata.store binds the store API (abi/kvstrata_store.h): Store, batches of
gets and puts by an engine's own keys into its own buffers. Importing this package loads nothing: the library is found on first use
(KVSTRATA_LIBRARY, then this package's folder, then the system loader).
"""

from kvstrata._abi import (  # noqa: F401
    ABI_MAJOR,
    ABI_MINOR,
    Handle,
    KvsError,
    LibraryNotFound,
    library_loaded,
    load_library,
)
from kvstrata.store import Store, StoreError  # noqa: F401

__version__ = "0.1.0"
