"""A tiny Llama whose attention reads and writes a paged KV cache, as an engine runs one.

The weights are those of a randomly initialised `transformers.LlamaForCausalLM` built from a
`LlamaConfig` (no download) when transformers is importable, else tensors of the same names and
shapes drawn from a seeded generator. The forward pass is written here over the engine's pages, as
vLLM runs Hugging Face weights with its own attention: per layer, the K and V of the step's new tokens
are written into the request's blocks, then attention reads K and V of every position from the
blocks. `dense()` runs the same arithmetic with no pages, for reference, and `hf_logits()` runs the
transformers model itself, to show that the arithmetic here is Llama's.
"""

def _config_values(cfg):
    theta = getattr(cfg, "rope_theta", None)
    if theta is None:
        theta = (getattr(cfg, "rope_parameters", None) or {}).get("rope_theta", 10000.0)
    return float(theta), float(cfg.rms_norm_eps)


class TinyLlama:
    """dims: vocab, hidden, layers, q_heads, kv_heads, head_dim, ffn. dtype: a torch dtype."""

    def __init__(self, torch, dims, dtype, device, seed=1234):
        self.torch = torch
        self.dims = dims
        self.dtype = dtype
        self.device = device
        self.hf = None
        torch.manual_seed(seed)
        try:
            import transformers
        except ImportError:
            transformers = None
        if transformers is not None:
            cfg = transformers.LlamaConfig(
                vocab_size=dims["vocab"], hidden_size=dims["hidden"],
                intermediate_size=dims["ffn"], num_hidden_layers=dims["layers"],
                num_attention_heads=dims["q_heads"], num_key_value_heads=dims["kv_heads"],
                head_dim=dims["head_dim"], max_position_embeddings=4096, rms_norm_eps=1e-6,
                tie_word_embeddings=False, attention_bias=False, mlp_bias=False,
                attn_implementation="eager")
            self.hf = transformers.LlamaForCausalLM(cfg).to(device=device, dtype=dtype).eval()
            self.theta, self.eps = _config_values(cfg)
            self.w = {k: v.detach() for k, v in self.hf.state_dict().items()}
            self.source = f"transformers {transformers.__version__} LlamaForCausalLM"
        else:
            self.theta, self.eps = 10000.0, 1e-6
            self.w = self._seeded_weights()
            self.source = "seeded tensors of LlamaForCausalLM's names and shapes"
        d = dims["head_dim"]
        inv = 1.0 / (self.theta ** (torch.arange(0, d, 2, dtype=torch.float32, device=device) / d))
        self.inv_freq = inv

    def _seeded_weights(self):
        torch, D = self.torch, self.dims
        g = torch.Generator().manual_seed(1234)
        h, d, f = D["hidden"], D["head_dim"], D["ffn"]

        def lin(o, i):
            return torch.empty(o, i).normal_(0.0, 0.02, generator=g)

        def norm(n):
            return 1.0 + torch.empty(n).normal_(0.0, 0.1, generator=g)

        w = {"model.embed_tokens.weight": lin(D["vocab"], h), "model.norm.weight": norm(h),
             "lm_head.weight": lin(D["vocab"], h)}
        for i in range(D["layers"]):
            p = f"model.layers.{i}."
            w[p + "self_attn.q_proj.weight"] = lin(D["q_heads"] * d, h)
            w[p + "self_attn.k_proj.weight"] = lin(D["kv_heads"] * d, h)
            w[p + "self_attn.v_proj.weight"] = lin(D["kv_heads"] * d, h)
            w[p + "self_attn.o_proj.weight"] = lin(h, D["q_heads"] * d)
            w[p + "mlp.gate_proj.weight"] = lin(f, h)
            w[p + "mlp.up_proj.weight"] = lin(f, h)
            w[p + "mlp.down_proj.weight"] = lin(h, f)
            w[p + "input_layernorm.weight"] = norm(h)
            w[p + "post_attention_layernorm.weight"] = norm(h)
        return {k: v.to(device=self.device, dtype=self.dtype) for k, v in w.items()}

    # -- arithmetic --

    def _rms(self, x, weight):
        torch = self.torch
        xf = x.to(torch.float32)
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return weight * xf.to(x.dtype)

    def _rope(self, x, positions):
        """x: (n, heads, d); positions: (n,) absolute positions."""
        torch = self.torch
        freqs = positions.to(torch.float32).unsqueeze(1) * self.inv_freq.unsqueeze(0)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos().to(x.dtype).unsqueeze(1), emb.sin().to(x.dtype).unsqueeze(1)
        half = x.shape[-1] // 2
        rot = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * cos + rot * sin

    def begin(self, tokens, start):
        """The step's state for one request: the embeddings of its new tokens at positions
        start.. start+len(tokens)."""
        torch = self.torch
        ids = torch.tensor(tokens, dtype=torch.long, device=self.device)
        pos = torch.arange(start, start + len(tokens), dtype=torch.long, device=self.device)
        return {"x": self.w["model.embed_tokens.weight"][ids], "pos": pos, "start": start}

    def qkv(self, layer, state):
        """Normed input, then q (n, qh, d), k and v (n, kvh, d) of the new tokens, roped."""
        D, w, p = self.dims, self.w, f"model.layers.{layer}."
        n, d = state["x"].shape[0], D["head_dim"]
        h = self._rms(state["x"], w[p + "input_layernorm.weight"])
        q = (h @ w[p + "self_attn.q_proj.weight"].T).view(n, D["q_heads"], d)
        k = (h @ w[p + "self_attn.k_proj.weight"].T).view(n, D["kv_heads"], d)
        v = (h @ w[p + "self_attn.v_proj.weight"].T).view(n, D["kv_heads"], d)
        return self._rope(q, state["pos"]), self._rope(k, state["pos"]), v

    def attend(self, layer, state, q, keys, values):
        """keys, values: (start + n, kvh, d) for every position so far; updates state["x"]."""
        torch, D, w, p = self.torch, self.dims, self.w, f"model.layers.{layer}."
        n, d, start = q.shape[0], D["head_dim"], state["start"]
        rep = D["q_heads"] // D["kv_heads"]
        kk = keys.repeat_interleave(rep, dim=1).transpose(0, 1)  # (qh, T, d)
        vv = values.repeat_interleave(rep, dim=1).transpose(0, 1)
        qq = q.transpose(0, 1)  # (qh, n, d)
        scores = (qq @ kk.transpose(1, 2)) * (d ** -0.5)
        T = keys.shape[0]
        rows = torch.arange(start, start + n, device=self.device).unsqueeze(1)
        cols = torch.arange(T, device=self.device).unsqueeze(0)
        scores = scores.masked_fill((cols > rows).unsqueeze(0), float("-inf"))
        probs = torch.softmax(scores.to(torch.float32), dim=-1).to(q.dtype)
        att = (probs @ vv).transpose(0, 1).reshape(n, D["q_heads"] * d)
        x = state["x"] + att @ w[p + "self_attn.o_proj.weight"].T
        h = self._rms(x, w[p + "post_attention_layernorm.weight"])
        g = torch.nn.functional.silu(h @ w[p + "mlp.gate_proj.weight"].T)
        u = h @ w[p + "mlp.up_proj.weight"].T
        state["x"] = x + (g * u) @ w[p + "mlp.down_proj.weight"].T

    def finish(self, state):
        """Logits of every new token: (n, vocab) in float32."""
        x = self._rms(state["x"], self.w["model.norm.weight"])
        return (x @ self.w["lm_head.weight"].T).to(self.torch.float32)

    # -- references --

    def dense(self, tokens, past=None):
        """The same arithmetic with no pages: logits of `tokens` after `past` ([(k, v)] per layer,
        positions 0..len-1), and every layer's (k, v) including the past."""
        start = 0 if past is None else past[0][0].shape[0]
        state = self.begin(tokens, start)
        kv = []
        for layer in range(self.dims["layers"]):
            q, k, v = self.qkv(layer, state)
            if past is not None:
                k = self.torch.cat((past[layer][0], k))
                v = self.torch.cat((past[layer][1], v))
            self.attend(layer, state, q, k, v)
            kv.append((k, v))
        return self.finish(state), kv

    def hf_logits(self, tokens):
        """transformers' own forward of the same weights (None without transformers)."""
        if self.hf is None:
            return None
        torch = self.torch
        with torch.no_grad():
            ids = torch.tensor([tokens], dtype=torch.long, device=self.device)
            return self.hf(input_ids=ids, use_cache=False).logits[0].to(torch.float32)
