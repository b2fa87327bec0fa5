"""The scheduler-side connector's view of one vLLM request: its tokens and block tables (one per
KV cache group) as far as the library holds them, and what besides its tokens its KV depends on
(key inputs: cache_salt, LoRA adapter, multimodal hashes, the reset epoch)."""

import array

from kvstrata.vllm_model import KvstrataConfigError

_NEVER = 1 << 62  # an n_computed no request reaches


class _SchedRequest:
    __slots__ = ("request", "tokens", "tables", "bypass", "looked_up", "load_async",
                 "async_armed", "keyed", "tenant", "sent", "sent_tables", "load_pending",
                 "prompt_tokens", "handoff_deadline", "group_from", "lookup_computed", "marked",
                 "skip_from", "parked", "past_prompt")

    def __init__(self, request=None, bypass=None, n_groups=1):
        self.request = request
        self.tokens = array.array("i")
        self.tables = [[] for _ in range(n_groups)]  # block table per KV cache group
        self.sent_tables = [0] * n_groups  # build_meta_update: the library holds tables[g][:n]
        self.marked = [0] * n_groups  # window groups: blocks already given as BLOCK_NONE
        self.group_from = None  # the last lookup: the token each group's load starts at
        self.lookup_computed = 0
        self.bypass = bypass
        self.looked_up = False
        self.load_async = False  # the last lookup's hit loads between steps
        self.async_armed = False  # on_alloc armed that asynchronous load
        self.keyed = False  # its key inputs went to the library
        self.tenant = "-"
        # build_meta_update: the library holds tokens[:sent]
        self.sent = 0
        self.load_pending = False  # on_alloc armed a load no step has carried yet
        self.prompt_tokens = getattr(request, "num_prompt_tokens", None)
        self.skip_from = _NEVER  # build_meta_update: not handed over from this n_computed on
        self.parked = False  # build_meta_update: past skip_from, its table no longer followed
        self.past_prompt = False  # build_meta_update: the last visit found it past skip_from
        self.handoff_deadline = None  # consumer: waits for the producer's chunks until then

    @property
    def block_ids(self):  # group 0's table
        return self.tables[0]

    @block_ids.setter
    def block_ids(self, ids):
        self.tables[0] = ids

    @property
    def sent_blocks(self):
        return self.sent_tables[0]

    @sent_blocks.setter
    def sent_blocks(self, n):
        self.sent_tables[0] = n


def _bypass_reason(req):
    """Why a request's KV cannot be keyed by kvstrata (its tokens and key inputs), or None."""
    if getattr(req, "prompt_embeds", None) is not None:
        return "prompt embeddings"
    if getattr(req, "mm_inputs", None) and not getattr(req, "mm_features", None):
        return "multimodal inputs without hashes"
    return None


def _text(v):
    return str(v).encode("utf-8", "surrogatepass")


def key_inputs(req, epoch=None):
    """What besides its tokens a request's KV depends on, as (first token, bytes) pairs for the
    library's request_key_input: the tenant's cache_salt and the LoRA adapter (from token 0), each
    multimodal input's hash at its placeholder's first position (vLLM's own block hashes take the
    same inputs), and the connector's reset epoch. Each part is tagged, so no two kinds collide."""
    out = []
    if epoch:
        out.append((0, b"epoch\0" + epoch))
    salt = getattr(req, "cache_salt", None)
    if salt:
        out.append((0, b"cache_salt\0" + _text(salt)))
    lora = getattr(req, "lora_request", None)
    if lora is not None:
        name = getattr(lora, "lora_name", None) or getattr(lora, "name", None) or ""
        path = getattr(lora, "lora_path", None) or getattr(lora, "path", None) or ""
        out.append((0, b"lora\0" + _text(name) + b"\0" + _text(path)))
    for f in getattr(req, "mm_features", None) or ():
        ident = getattr(f, "identifier", None) or getattr(f, "mm_hash", None)
        pos = getattr(f, "mm_position", None)
        if ident is None or pos is None:
            raise KvstrataConfigError(
                "kvstrata: a multimodal input without an identifier or a position cannot be keyed")
        offset = int(pos.offset)
        out.append((offset, b"mm\0" + _text(ident) + b"\0" + _text(offset)))
    return out


def tenant_label(req):
    """The label a request's tenant is counted under: a short hash of its cache_salt (the salt may
    be a secret), "-" without one."""
    salt = getattr(req, "cache_salt", None)
    if not salt:
        return "-"
    import hashlib

    return hashlib.sha256(_text(salt)).hexdigest()[:12]


def _per_group(block_ids, n_groups):
    """vLLM's block ids per KV cache group (a tuple of lists, or one list for one group) as a list
    of n_groups lists (None: nothing new)."""
    if block_ids is None:
        return None
    if isinstance(block_ids, tuple) or (block_ids and isinstance(block_ids[0], (list, tuple))):
        out = [list(b) for b in block_ids]
    else:
        out = [list(block_ids)]
    if len(out) < n_groups:
        out += [[] for _ in range(n_groups - len(out))]
    return out[:n_groups]


def _set_tokens(st, source):
    """Bring st.tokens up to `source` (a list-like of every token so far), appending when only new
    tokens came, copying otherwise."""
    n, have = len(source), len(st.tokens)
    if n > have and have and source[have - 1] == st.tokens[have - 1]:
        st.tokens.extend(source[have:])
    elif n != have or (n and source[n - 1] != st.tokens[n - 1]):
        st.tokens = array.array("i", source)
        st.sent = 0  # the library's copy is another list now: hand over the whole one
