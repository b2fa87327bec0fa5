"""vLLM's connector base classes (vLLM's own when it is installed, kvstrata's stand-ins otherwise)
and the step metadata KvstrataConnector passes from the scheduler to the workers."""

try:  # the real vLLM classes when vLLM is installed
    from vllm.distributed.kv_transfer.kv_connector.v1.base import (
        KVConnectorBase_V1,
        KVConnectorMetadata,
        KVConnectorRole,
        SupportsHMA,
    )

    HAVE_VLLM = True
except ImportError:
    from kvstrata._vllm_standin import (
        KVConnectorBase_V1,
        KVConnectorMetadata,
        KVConnectorRole,
        SupportsHMA,
    )

    HAVE_VLLM = False


class KvstrataConnectorMetadata(KVConnectorMetadata):
    """One step's metadata: the msgpack blob build_meta made (opaque to Python, pickled to the
    workers with the scheduler output)."""

    def __init__(self, blob, req_ids=(), blobs=None, sending_groups=None):
        self.blob = bytes(blob)  # group 0's
        self.blobs = [self.blob] + [bytes(b) for b in blobs[1:]] if blobs else [self.blob]
        self.req_ids = tuple(req_ids)
        # finished requests whose pages some groups' handles keep: {req_id: number of those
        # groups} (the workers report such a request once each of them did)
        self.sending_groups = dict(sending_groups or {})

    def __repr__(self):
        return f"KvstrataConnectorMetadata({len(self.blob)} bytes, {len(self.req_ids)} requests)"
